// GPUs seen through NVML, the NVIDIA driver's management library. The library is opened with
// dlopen at run time (no NVML header or link-time dependency), so one fitrund binary runs on
// machines with and without the driver: Create returns NOT_FOUND where the library is absent and the
// caller falls back to virtual CPU devices.
//
// Thread-safe: any thread may call Snapshot; a mutex serialises the NVML queries and the cached
// figures. The object owns the NVML session (nvmlInit/nvmlShutdown) and the library handle.
#ifndef FITRUN_SERVER_DEVICES_NVML_DEVICES_H_
#define FITRUN_SERVER_DEVICES_NVML_DEVICES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/device_inventory.h"

namespace fitrun::server {

class NvmlDevices : public DeviceInventory {
 public:
  struct Options {
    // Passed to dlopen; tests point it at a fake library.
    std::string library_path = "libnvidia-ml.so.1";
  };

  // Opens the library, initialises NVML and reads every device once. NOT_FOUND when the library
  // cannot be opened; otherwise an error naming the NVML call that failed and NVML's reason.
  static absl::StatusOr<std::unique_ptr<NvmlDevices>> Create(Options options);

  ~NvmlDevices() override;
  NvmlDevices(const NvmlDevices&) = delete;
  NvmlDevices& operator=(const NvmlDevices&) = delete;

  // Devices "cuda:N" in NVML index order with fresh memory and utilization figures (utilization as
  // a fraction, 0 to 1). A device whose query fails keeps its last figures rather than vanishing,
  // so a transient driver error does not look to the planner like a lost GPU.
  std::vector<fitrun::v1::Device> Snapshot() override;

 private:
  struct Api;  // The loaded library and the entry points read here.

  NvmlDevices();
  // Re-reads memory and utilization of devices_[index]; an error names the failing call and leaves
  // the device's figures as they were.
  absl::Status RefreshDeviceLocked(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Api> api_;

  absl::Mutex mu_;
  std::vector<void*> handles_ ABSL_GUARDED_BY(mu_);  // nvmlDevice_t per index.
  std::vector<fitrun::v1::Device> devices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_DEVICES_NVML_DEVICES_H_
