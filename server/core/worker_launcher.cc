#include "server/core/worker_launcher.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fitrun::server {

namespace {

struct HandleRank {
  int pid = 0;
  int64_t start_ticks = 0;  // 0: not recorded
  std::string warm_id;      // empty: none
};

// Each rank of a LocalLaunchHandle: "<pid>[@<start ticks>][~<warm id>]".
absl::StatusOr<std::vector<HandleRank>> RanksInLocalLaunchHandle(const std::string& handle) {
  absl::string_view rest = handle;
  if (!absl::ConsumePrefix(&rest, "pids:")) {
    return absl::InvalidArgumentError(absl::StrCat("'", handle, "' is not a local launch's handle"));
  }
  std::vector<HandleRank> ranks;
  for (absl::string_view field : absl::StrSplit(rest, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> process_and_warm = absl::StrSplit(field, absl::MaxSplits('~', 1));
    std::pair<absl::string_view, absl::string_view> pid_and_start =
        absl::StrSplit(process_and_warm.first, absl::MaxSplits('@', 1));
    HandleRank rank;
    if (!absl::SimpleAtoi(pid_and_start.first, &rank.pid) || rank.pid < 0 ||
        (!pid_and_start.second.empty() && !absl::SimpleAtoi(pid_and_start.second, &rank.start_ticks))) {
      return absl::InvalidArgumentError(absl::StrCat("'", handle, "' is not a local launch's handle"));
    }
    rank.warm_id = std::string(process_and_warm.second);
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

}  // namespace

std::string LocalLaunchHandle(const std::vector<int>& pids, const std::vector<std::string>& warm_ids,
                              const std::vector<int64_t>& start_ticks) {
  std::vector<std::string> fields;
  for (size_t rank = 0; rank < pids.size(); ++rank) {
    std::string field = absl::StrCat(pids[rank]);
    if (rank < start_ticks.size() && start_ticks[rank] > 0) absl::StrAppend(&field, "@", start_ticks[rank]);
    if (rank < warm_ids.size() && !warm_ids[rank].empty()) absl::StrAppend(&field, "~", warm_ids[rank]);
    fields.push_back(std::move(field));
  }
  return absl::StrCat("pids:", absl::StrJoin(fields, ","));
}

absl::StatusOr<std::vector<int>> PidsInLocalLaunchHandle(const std::string& handle) {
  absl::StatusOr<std::vector<HandleRank>> ranks = RanksInLocalLaunchHandle(handle);
  if (!ranks.ok()) return ranks.status();
  std::vector<int> pids;
  for (const HandleRank& rank : *ranks) pids.push_back(rank.pid);
  return pids;
}

absl::StatusOr<std::vector<std::string>> WarmIdsInLocalLaunchHandle(const std::string& handle) {
  absl::StatusOr<std::vector<HandleRank>> ranks = RanksInLocalLaunchHandle(handle);
  if (!ranks.ok()) return ranks.status();
  std::vector<std::string> warm_ids;
  for (const HandleRank& rank : *ranks) warm_ids.push_back(rank.warm_id);
  return warm_ids;
}

absl::StatusOr<std::vector<int64_t>> StartTicksInLocalLaunchHandle(const std::string& handle) {
  absl::StatusOr<std::vector<HandleRank>> ranks = RanksInLocalLaunchHandle(handle);
  if (!ranks.ok()) return ranks.status();
  std::vector<int64_t> ticks;
  for (const HandleRank& rank : *ranks) ticks.push_back(rank.start_ticks);
  return ticks;
}

}  // namespace fitrun::server
