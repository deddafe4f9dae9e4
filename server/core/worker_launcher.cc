#include "server/core/worker_launcher.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fitrun::server {

std::string LocalLaunchHandle(const std::vector<int>& pids) { return absl::StrCat("pids:", absl::StrJoin(pids, ",")); }

absl::StatusOr<std::vector<int>> PidsInLocalLaunchHandle(const std::string& handle) {
  absl::string_view rest = handle;
  if (!absl::ConsumePrefix(&rest, "pids:")) {
    return absl::InvalidArgumentError(absl::StrCat("'", handle, "' is not a local launch's handle"));
  }
  std::vector<int> pids;
  for (absl::string_view field : absl::StrSplit(rest, ',', absl::SkipEmpty())) {
    int pid = 0;
    if (!absl::SimpleAtoi(field, &pid) || pid < 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", handle, "' is not a local launch's handle"));
    }
    pids.push_back(pid);
  }
  return pids;
}

}  // namespace fitrun::server
