#include "server/devices/nvml_devices.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/nvml_library.h"

namespace fitrun::server {
namespace {

using contract::kNvmlSuccess;
using contract::NvmlDevice;
using contract::NvmlReturn;

// The slice of NVML's ABI read here (see proto/contract/nvml_library.h).
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
  std::unique_ptr<contract::NvmlLibrary> nvml;
  NvmlReturn (*get_count)(unsigned int*) = nullptr;
  NvmlReturn (*get_handle_by_index)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*get_memory_info)(NvmlDevice, nvmlMemory_t*) = nullptr;
  NvmlReturn (*get_utilization_rates)(NvmlDevice, nvmlUtilization_t*) = nullptr;
  NvmlReturn (*get_name)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*get_uuid)(NvmlDevice, char*, unsigned int) = nullptr;

  absl::Status Error(absl::string_view call, NvmlReturn code) const { return nvml->Error(call, code); }
};

NvmlDevices::NvmlDevices() : api_(std::make_unique<Api>()) {}

NvmlDevices::~NvmlDevices() = default;

absl::StatusOr<std::unique_ptr<NvmlDevices>> NvmlDevices::Create(Options options) {
  absl::StatusOr<std::unique_ptr<contract::NvmlLibrary>> library = contract::NvmlLibrary::Load(options.library_path);
  if (!library.ok()) return library.status();
  std::unique_ptr<NvmlDevices> nvml(new NvmlDevices());
  Api& api = *nvml->api_;
  api.nvml = *std::move(library);
  const contract::NvmlLibrary& lib = *api.nvml;
  for (absl::Status status : {lib.Resolve("nvmlDeviceGetCount_v2", &api.get_count),
                              lib.Resolve("nvmlDeviceGetHandleByIndex_v2", &api.get_handle_by_index),
                              lib.Resolve("nvmlDeviceGetMemoryInfo", &api.get_memory_info),
                              lib.Resolve("nvmlDeviceGetUtilizationRates", &api.get_utilization_rates),
                              lib.Resolve("nvmlDeviceGetName", &api.get_name),
                              lib.Resolve("nvmlDeviceGetUUID", &api.get_uuid)}) {
    if (!status.ok()) return status;
  }
  if (absl::Status status = api.nvml->Init(); !status.ok()) return status;

  unsigned int count = 0;
  if (NvmlReturn code = api.get_count(&count); code != kNvmlSuccess) {
    return api.Error("nvmlDeviceGetCount_v2", code);
  }
  absl::MutexLock lock(&nvml->mu_);
  for (unsigned int index = 0; index < count; ++index) {
    NvmlDevice handle = nullptr;
    if (NvmlReturn code = api.get_handle_by_index(index, &handle); code != kNvmlSuccess) {
      return api.Error(absl::StrCat("nvmlDeviceGetHandleByIndex_v2(", index, ")"), code);
    }
    // Name and UUID do not change while the driver is loaded, so they are read once here.
    char name[kNameBufferSize] = {};
    if (NvmlReturn code = api.get_name(handle, name, sizeof(name)); code != kNvmlSuccess) {
      return api.Error(absl::StrCat("nvmlDeviceGetName(cuda:", index, ")"), code);
    }
    char uuid[kUuidBufferSize] = {};
    if (NvmlReturn code = api.get_uuid(handle, uuid, sizeof(uuid)); code != kNvmlSuccess) {
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
  NvmlDevice handle = static_cast<NvmlDevice>(handles_[index]);
  fitrun::v1::Device& device = devices_[index];
  nvmlMemory_t memory = {};
  if (NvmlReturn code = api_->get_memory_info(handle, &memory); code != kNvmlSuccess) {
    return api_->Error(absl::StrCat("nvmlDeviceGetMemoryInfo(", device.id(), ")"), code);
  }
  nvmlUtilization_t utilization = {};
  if (NvmlReturn code = api_->get_utilization_rates(handle, &utilization); code != kNvmlSuccess) {
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
