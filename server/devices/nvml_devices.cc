#include "server/devices/nvml_devices.h"

#include <dlfcn.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace fitrun::server {
namespace {

// The slice of NVML's ABI that we use, declared here because no nvml.h ships on our build machines.
// Layouts and signatures follow NVIDIA's nvml.h; the _v2 entry points are the ones current drivers
// export.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;     // Percent of the sample period a kernel was running.
  unsigned int memory;  // Percent of the sample period device memory was read or written.
};
// NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE.
constexpr unsigned int kNameBufferSize = 96;
constexpr unsigned int kUuidBufferSize = 96;

}  // namespace

struct NvmlDevices::Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*get_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*get_handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*get_utilization_rates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*get_uuid)(nvmlDevice_t, char*, unsigned int) = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;

  // "nvmlDeviceGetMemoryInfo failed: Unknown Error (999)".
  absl::Status Error(absl::string_view call, nvmlReturn_t code) const {
    const char* reason = error_string != nullptr ? error_string(code) : nullptr;
    return absl::InternalError(absl::StrCat(call, " failed: ", reason != nullptr ? reason : "unknown NVML error",
                                            " (NVML error ", code, ")"));
  }
};

namespace {

// Resolves `name` into `fn`; a missing symbol means a driver older than the entry points we use.
template <typename Fn>
absl::Status Resolve(void* library, const std::string& path, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(path, " has no ", name, "; the NVIDIA driver is older than the NVML calls fitrun uses"));
}

}  // namespace

NvmlDevices::NvmlDevices() : api_(std::make_unique<Api>()) {}

NvmlDevices::~NvmlDevices() {
  if (initialized_) api_->shutdown();
  if (library_ != nullptr) dlclose(library_);
}

absl::StatusOr<std::unique_ptr<NvmlDevices>> NvmlDevices::Create(Options options) {
  // Built first so that its destructor undoes whatever succeeded if a later step fails.
  std::unique_ptr<NvmlDevices> nvml(new NvmlDevices());
  dlerror();
  nvml->library_ = dlopen(options.library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (nvml->library_ == nullptr) {
    const char* reason = dlerror();
    return absl::NotFoundError(absl::StrCat("cannot load NVML from '", options.library_path,
                                            "' (no NVIDIA driver on this machine?): ",
                                            reason != nullptr ? reason : "dlopen failed"));
  }
  Api& api = *nvml->api_;
  void* lib = nvml->library_;
  const std::string& path = options.library_path;
  for (absl::Status status : {Resolve(lib, path, "nvmlErrorString", &api.error_string),
                              Resolve(lib, path, "nvmlInit_v2", &api.init),
                              Resolve(lib, path, "nvmlShutdown", &api.shutdown),
                              Resolve(lib, path, "nvmlDeviceGetCount_v2", &api.get_count),
                              Resolve(lib, path, "nvmlDeviceGetHandleByIndex_v2", &api.get_handle_by_index),
                              Resolve(lib, path, "nvmlDeviceGetMemoryInfo", &api.get_memory_info),
                              Resolve(lib, path, "nvmlDeviceGetUtilizationRates", &api.get_utilization_rates),
                              Resolve(lib, path, "nvmlDeviceGetName", &api.get_name),
                              Resolve(lib, path, "nvmlDeviceGetUUID", &api.get_uuid)}) {
    if (!status.ok()) return status;
  }

  if (nvmlReturn_t code = api.init(); code != NVML_SUCCESS) return api.Error("nvmlInit_v2", code);
  nvml->initialized_ = true;

  unsigned int count = 0;
  if (nvmlReturn_t code = api.get_count(&count); code != NVML_SUCCESS) {
    return api.Error("nvmlDeviceGetCount_v2", code);
  }
  absl::MutexLock lock(&nvml->mu_);
  for (unsigned int index = 0; index < count; ++index) {
    nvmlDevice_t handle = nullptr;
    if (nvmlReturn_t code = api.get_handle_by_index(index, &handle); code != NVML_SUCCESS) {
      return api.Error(absl::StrCat("nvmlDeviceGetHandleByIndex_v2(", index, ")"), code);
    }
    // Name and UUID do not change while the driver is loaded, so they are read once here.
    char name[kNameBufferSize] = {};
    if (nvmlReturn_t code = api.get_name(handle, name, sizeof(name)); code != NVML_SUCCESS) {
      return api.Error(absl::StrCat("nvmlDeviceGetName(cuda:", index, ")"), code);
    }
    char uuid[kUuidBufferSize] = {};
    if (nvmlReturn_t code = api.get_uuid(handle, uuid, sizeof(uuid)); code != NVML_SUCCESS) {
      return api.Error(absl::StrCat("nvmlDeviceGetUUID(cuda:", index, ")"), code);
    }
    fitrun::v1::Device device;
    device.set_id(absl::StrCat("cuda:", index));
    device.set_kind(fitrun::v1::DEVICE_KIND_CUDA);
    device.set_name(name);
    device.set_uuid(uuid);
    nvml->handles_.push_back(handle);
    nvml->devices_.push_back(std::move(device));
    if (absl::Status status = nvml->RefreshDeviceLocked(index); !status.ok()) return status;
  }
  return nvml;
}

absl::Status NvmlDevices::RefreshDeviceLocked(size_t index) {
  nvmlDevice_t handle = static_cast<nvmlDevice_t>(handles_[index]);
  fitrun::v1::Device& device = devices_[index];
  nvmlMemory_t memory = {};
  if (nvmlReturn_t code = api_->get_memory_info(handle, &memory); code != NVML_SUCCESS) {
    return api_->Error(absl::StrCat("nvmlDeviceGetMemoryInfo(", device.id(), ")"), code);
  }
  nvmlUtilization_t utilization = {};
  if (nvmlReturn_t code = api_->get_utilization_rates(handle, &utilization); code != NVML_SUCCESS) {
    return api_->Error(absl::StrCat("nvmlDeviceGetUtilizationRates(", device.id(), ")"), code);
  }
  device.set_total_bytes(static_cast<int64_t>(memory.total));
  device.set_free_bytes(static_cast<int64_t>(memory.free));
  device.set_used_bytes(static_cast<int64_t>(memory.used));
  device.set_utilization(utilization.gpu / 100.0);
  return absl::OkStatus();
}

std::vector<fitrun::v1::Device> NvmlDevices::Snapshot() {
  absl::MutexLock lock(&mu_);
  for (size_t index = 0; index < devices_.size(); ++index) {
    // On failure the device keeps its previous figures (see the header); the interface has no
    // error channel, and a missing device would read as a lost GPU.
    RefreshDeviceLocked(index).IgnoreError();
  }
  return devices_;
}

}  // namespace fitrun::server
