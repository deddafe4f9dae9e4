// What GPU runs taught about a GPU model's costs beyond the tensors (memory/device_costs.h): for each
// GPU model and caching-allocator setting, the reserve its allocator kept over its allocated peak and
// what the process held outside the allocator (context, libraries, collectives), as ranks reported
// them. Kept per Unix account the ranks ran as (Job.run_as; "": fitrund's own user): a rank's report
// is its account's word, so it teaches that account's plans and no other's. Plans on that GPU model start from these instead of the defaults measured on an H100, so each
// run corrects the next plan; the runs are kept in a file so a restarted fitrund keeps them.
//
// Thread-safety: every method may be called from any thread.
#ifndef FITRUN_SERVER_CORE_CALIBRATION_DEVICE_COSTS_BOOK_H_
#define FITRUN_SERVER_CORE_CALIBRATION_DEVICE_COSTS_BOOK_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/memory/device_costs.h"

namespace fitrun::server {

// One rank's peaks on a GPU over a run: what its allocator handed out and reserved, and the whole
// process's footprint on the device.
struct GpuRunPeaks {
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t device_bytes = 0;
};

class DeviceCostsBook {
 public:
  // `path`: where runs are kept (appended; read back at start); empty: in memory only.
  static absl::StatusOr<std::unique_ptr<DeviceCostsBook>> Create(std::string path);

  // The costs a plan on a GPU named `device_name` with `allocator_config` assumes: the defaults until
  // runs are recorded, then the highest reserve ratio and outside-the-allocator footprint the runs
  // showed, 3% above.
  DeviceCosts CostsFor(const std::string& run_as, const std::string& device_name,
                       const std::string& allocator_config) const;

  // A finished run's highest peaks on such a device (peaks of 0 teach nothing and are ignored).
  void RecordRun(const std::string& run_as, const std::string& device_name, const std::string& allocator_config,
                 const GpuRunPeaks& peaks);

 private:
  explicit DeviceCostsBook(std::string path) : path_(std::move(path)) {}
  using Key = std::tuple<std::string, std::string, std::string>;  // (account, device name, allocator config)
  void RememberLocked(const Key& key, const GpuRunPeaks& peaks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  // The most recent runs per key (what is learned adapts when a driver or library changes).
  std::map<Key, std::deque<GpuRunPeaks>> runs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_CALIBRATION_DEVICE_COSTS_BOOK_H_
