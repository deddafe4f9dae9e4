#include "server/core/jobs/run_peaks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/units.h"

namespace fitrun::server {

std::string ImpossiblePeak(const ActiveAttempt& attempt, const std::vector<fitrun::v1::Device>& devices,
                           int64_t reported) {
  // The attempt's cgroup saw every byte its processes held (on the host: a CPU device's tensors too).
  int64_t host_peak = 0;
  for (const RankState& rank : attempt.ranks) host_peak = std::max(host_peak, rank.exit.host_memory_peak_bytes);
  bool on_cpu = false;
  int64_t device_bytes = 0;
  for (const fitrun::v1::Device& device : devices) {
    if (std::find(attempt.device_ids.begin(), attempt.device_ids.end(), device.id()) == attempt.device_ids.end()) {
      continue;
    }
    on_cpu |= device.kind() == fitrun::v1::DEVICE_KIND_CPU;
    device_bytes = std::max(device_bytes, device.total_bytes());
  }
  if (device_bytes > 0 && reported > device_bytes) {
    return absl::StrCat("a rank reported a peak of ", FormatBytes(reported), ", more than its device has (",
                        FormatBytes(device_bytes), ")");
  }
  if (on_cpu && host_peak > 0 && reported > host_peak) {
    return absl::StrCat("a rank reported a peak of ", FormatBytes(reported),
                        ", more than the attempt's processes held together (", FormatBytes(host_peak),
                        " by its cgroup)");
  }
  return "";
}

}  // namespace fitrun::server
