#include "worker/memory/process_gpu_memory.h"

#include <dlfcn.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fitrun::worker {
namespace {

// The slice of NVML's ABI used here, declared because no nvml.h ships on the build machines; layouts
// and signatures follow NVIDIA's nvml.h.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
using nvmlDevice_t = struct nvmlDevice_st*;
// nvmlProcessInfo_t (= nvmlProcessInfo_v2_t), what _v2 and _v3 of
// nvmlDeviceGetComputeRunningProcesses fill in.
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
// usedGpuMemory when the driver cannot tell (NVML_VALUE_NOT_AVAILABLE).
constexpr unsigned long long kValueNotAvailable = ~0ULL;
// Processes asked for at first; the driver says how many more there are.
constexpr unsigned int kInitialProcesses = 64;

// Resolves `name` into `fn`; a missing symbol means a driver older than the entry points used here.
template <typename Fn>
absl::Status Resolve(void* library, const std::string& path, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(path, " has no ", name, "; the NVIDIA driver is older than the NVML calls fitrun uses"));
}

}  // namespace

struct NvmlProcessMemory::Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*get_handle_by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_compute_processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  const char* compute_processes_name = "";
  const char* (*error_string)(nvmlReturn_t) = nullptr;

  // "nvmlDeviceGetHandleByPciBusId_v2(0000:17:00.0) failed: Not Found (NVML error 6)".
  absl::Status Error(absl::string_view call, nvmlReturn_t code) const {
    const char* reason = error_string != nullptr ? error_string(code) : nullptr;
    return absl::InternalError(absl::StrCat(call, " failed: ", reason != nullptr ? reason : "unknown NVML error",
                                            " (NVML error ", code, ")"));
  }
};

NvmlProcessMemory::NvmlProcessMemory() : api_(std::make_unique<Api>()) {}

NvmlProcessMemory::~NvmlProcessMemory() {
  if (initialized_) api_->shutdown();
  if (library_ != nullptr) dlclose(library_);
}

absl::StatusOr<std::unique_ptr<NvmlProcessMemory>> NvmlProcessMemory::Create(Options options) {
  // Built first so that its destructor undoes whatever succeeded if a later step fails.
  std::unique_ptr<NvmlProcessMemory> nvml(new NvmlProcessMemory());
  dlerror();
  nvml->library_ = dlopen(options.library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (nvml->library_ == nullptr) {
    const char* reason = dlerror();
    return absl::NotFoundError(absl::StrCat("cannot load NVML from '", options.library_path,
                                            "': ", reason != nullptr ? reason : "dlopen failed"));
  }
  Api& api = *nvml->api_;
  void* lib = nvml->library_;
  const std::string& path = options.library_path;
  for (absl::Status status : {Resolve(lib, path, "nvmlErrorString", &api.error_string),
                              Resolve(lib, path, "nvmlInit_v2", &api.init),
                              Resolve(lib, path, "nvmlShutdown", &api.shutdown),
                              Resolve(lib, path, "nvmlDeviceGetHandleByPciBusId_v2", &api.get_handle_by_pci_bus_id)}) {
    if (!status.ok()) return status;
  }
  // _v3 on current drivers, _v2 (the same record) on those before it.
  for (const char* name : {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"}) {
    if (Resolve(lib, path, name, &api.get_compute_processes).ok()) {
      api.compute_processes_name = name;
      break;
    }
  }
  if (api.get_compute_processes == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path, " has neither nvmlDeviceGetComputeRunningProcesses_v3 nor _v2; "
                                                      "the NVIDIA driver is older than the NVML calls fitrun uses"));
  }
  if (nvmlReturn_t code = api.init(); code != NVML_SUCCESS) return api.Error("nvmlInit_v2", code);
  nvml->initialized_ = true;
  return nvml;
}

absl::StatusOr<int64_t> NvmlProcessMemory::ProcessBytes(const std::string& pci_bus_id, int64_t pid) {
  nvmlDevice_t device = nullptr;
  if (nvmlReturn_t code = api_->get_handle_by_pci_bus_id(pci_bus_id.c_str(), &device); code != NVML_SUCCESS) {
    return api_->Error(absl::StrCat("nvmlDeviceGetHandleByPciBusId_v2(", pci_bus_id, ")"), code);
  }
  std::vector<nvmlProcessInfo_t> processes(kInitialProcesses);
  nvmlReturn_t code = NVML_ERROR_INSUFFICIENT_SIZE;
  unsigned int count = 0;
  // Processes may start between the driver saying how many there are and the next call.
  for (int attempt = 0; attempt < 4 && code == NVML_ERROR_INSUFFICIENT_SIZE; ++attempt) {
    count = static_cast<unsigned int>(processes.size());
    code = api_->get_compute_processes(device, &count, processes.data());
    if (code == NVML_ERROR_INSUFFICIENT_SIZE) processes.resize(std::max<size_t>(count, processes.size()) * 2);
  }
  if (code != NVML_SUCCESS) {
    return api_->Error(absl::StrCat(api_->compute_processes_name, "(", pci_bus_id, ")"), code);
  }
  // A process has one record per GPU, or one per GPU instance it uses on a MIG-partitioned GPU.
  int64_t bytes = 0;
  bool listed = false;
  for (unsigned int i = 0; i < count && i < processes.size(); ++i) {
    if (static_cast<int64_t>(processes[i].pid) != pid) continue;
    if (processes[i].usedGpuMemory == kValueNotAvailable) {
      return absl::UnavailableError(
          absl::StrCat("NVML does not know process ", pid, "'s memory on ", pci_bus_id, " (no permission?)"));
    }
    listed = true;
    bytes += static_cast<int64_t>(processes[i].usedGpuMemory);
  }
  if (!listed) {
    return absl::NotFoundError(absl::StrCat("NVML lists no process ", pid, " on the GPU at ", pci_bus_id,
                                            " (in a container, NVML names processes by the host's pids)"));
  }
  return bytes;
}

DeviceMemoryGauge::DeviceMemoryGauge(ProcessGpuMemoryReader* reader, std::string pci_bus_id, int64_t pid,
                                     std::function<absl::StatusOr<int64_t>()> whole_device)
    : reader_(reader), pci_bus_id_(std::move(pci_bus_id)), pid_(pid), whole_device_(std::move(whole_device)) {
  if (reader_ == nullptr) fallback_reason_ = "NVML is not available";
}

int64_t DeviceMemoryGauge::Sample() {
  int64_t bytes = 0;
  if (reader_ != nullptr) {
    absl::StatusOr<int64_t> own = reader_->ProcessBytes(pci_bus_id_, pid_);
    if (own.ok()) {
      bytes = *own;
    } else {
      fallback_reason_ = std::string(own.status().message());
      reader_ = nullptr;
    }
  }
  if (reader_ == nullptr) {
    absl::StatusOr<int64_t> device = whole_device_ ? whole_device_() : absl::UnavailableError("no fallback");
    bytes = device.ok() ? *device : 0;
  }
  peak_ = std::max(peak_, bytes);
  return bytes;
}

std::string DeviceMemoryGauge::Describe() const {
  if (fallback_reason_.empty()) {
    return absl::StrCat("process ", pid_, "'s own memory on the GPU at ", pci_bus_id_, " (NVML)");
  }
  return absl::StrCat("the whole device's used memory (cudaMemGetInfo), other processes' included: ",
                      fallback_reason_);
}

}  // namespace fitrun::worker
