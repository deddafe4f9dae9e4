#include "server/core/worker_launcher.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fitrun::server {

namespace {

// Each rank's pid and warm id (empty: none) in a LocalLaunchHandle.
absl::StatusOr<std::vector<std::pair<int, std::string>>> RanksInLocalLaunchHandle(const std::string& handle) {
  absl::string_view rest = handle;
  if (!absl::ConsumePrefix(&rest, "pids:")) {
    return absl::InvalidArgumentError(absl::StrCat("'", handle, "' is not a local launch's handle"));
  }
  std::vector<std::pair<int, std::string>> ranks;
  for (absl::string_view field : absl::StrSplit(rest, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> pid_and_warm = absl::StrSplit(field, absl::MaxSplits('~', 1));
    int pid = 0;
    if (!absl::SimpleAtoi(pid_and_warm.first, &pid) || pid < 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", handle, "' is not a local launch's handle"));
    }
    ranks.emplace_back(pid, std::string(pid_and_warm.second));
  }
  return ranks;
}

}  // namespace

std::string LocalLaunchHandle(const std::vector<int>& pids, const std::vector<std::string>& warm_ids) {
  std::vector<std::string> fields;
  for (size_t rank = 0; rank < pids.size(); ++rank) {
    const bool warm = rank < warm_ids.size() && !warm_ids[rank].empty();
    fields.push_back(warm ? absl::StrCat(pids[rank], "~", warm_ids[rank]) : absl::StrCat(pids[rank]));
  }
  return absl::StrCat("pids:", absl::StrJoin(fields, ","));
}

absl::StatusOr<std::vector<int>> PidsInLocalLaunchHandle(const std::string& handle) {
  absl::StatusOr<std::vector<std::pair<int, std::string>>> ranks = RanksInLocalLaunchHandle(handle);
  if (!ranks.ok()) return ranks.status();
  std::vector<int> pids;
  for (const auto& [pid, warm_id] : *ranks) pids.push_back(pid);
  return pids;
}

absl::StatusOr<std::vector<std::string>> WarmIdsInLocalLaunchHandle(const std::string& handle) {
  absl::StatusOr<std::vector<std::pair<int, std::string>>> ranks = RanksInLocalLaunchHandle(handle);
  if (!ranks.ok()) return ranks.status();
  std::vector<std::string> warm_ids;
  for (const auto& [pid, warm_id] : *ranks) warm_ids.push_back(warm_id);
  return warm_ids;
}

}  // namespace fitrun::server
