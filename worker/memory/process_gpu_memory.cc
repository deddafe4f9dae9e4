#include "worker/memory/process_gpu_memory.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/contract/nvml_library.h"

namespace fitrun::worker {
namespace {

using contract::kNvmlErrorInsufficientSize;
using contract::kNvmlSuccess;
using contract::NvmlDevice;
using contract::NvmlReturn;

// The slice of NVML's ABI read here (see proto/contract/nvml_library.h): nvmlProcessInfo_t
// (= nvmlProcessInfo_v2_t), what _v2 and _v3 of nvmlDeviceGetComputeRunningProcesses fill in.
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

}  // namespace

struct NvmlProcessMemory::Api {
  std::unique_ptr<contract::NvmlLibrary> nvml;
  NvmlReturn (*get_handle_by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*get_handle_by_index)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*get_compute_processes)(NvmlDevice, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  const char* compute_processes_name = "";

  // "nvmlDeviceGetHandleByPciBusId_v2(0000:17:00.0) failed: Not Found (NVML error 6)".
  absl::Status Error(absl::string_view call, NvmlReturn code) const { return nvml->Error(call, code); }
};

NvmlProcessMemory::NvmlProcessMemory() : api_(std::make_unique<Api>()) {}

NvmlProcessMemory::~NvmlProcessMemory() = default;

absl::StatusOr<std::unique_ptr<NvmlProcessMemory>> NvmlProcessMemory::Create(Options options) {
  absl::StatusOr<std::unique_ptr<contract::NvmlLibrary>> library = contract::NvmlLibrary::Load(options.library_path);
  if (!library.ok()) return library.status();
  std::unique_ptr<NvmlProcessMemory> reader(new NvmlProcessMemory());
  Api& api = *reader->api_;
  api.nvml = *std::move(library);
  const contract::NvmlLibrary& lib = *api.nvml;
  if (absl::Status status = lib.Resolve("nvmlDeviceGetHandleByPciBusId_v2", &api.get_handle_by_pci_bus_id);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = lib.Resolve("nvmlDeviceGetHandleByIndex_v2", &api.get_handle_by_index); !status.ok()) {
    return status;
  }
  // _v3 on current drivers, _v2 (the same record) on those before it.
  for (const char* name : {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"}) {
    if (lib.Resolve(name, &api.get_compute_processes).ok()) {
      api.compute_processes_name = name;
      break;
    }
  }
  if (api.get_compute_processes == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(lib.path(), " has neither nvmlDeviceGetComputeRunningProcesses_v3 nor _v2; "
                                                      "the NVIDIA driver is older than the NVML calls fitrun uses"));
  }
  if (absl::Status status = api.nvml->Init(); !status.ok()) return status;
  return reader;
}

absl::StatusOr<int64_t> NvmlProcessMemory::ProcessBytes(const std::string& pci_bus_id, int64_t pid) {
  NvmlDevice device = nullptr;
  if (NvmlReturn code = api_->get_handle_by_pci_bus_id(pci_bus_id.c_str(), &device); code != kNvmlSuccess) {
    return api_->Error(absl::StrCat("nvmlDeviceGetHandleByPciBusId_v2(", pci_bus_id, ")"), code);
  }
  return BytesOn(device, absl::StrCat("the GPU at ", pci_bus_id), pid);
}

absl::StatusOr<int64_t> NvmlProcessMemory::ProcessBytesAtIndex(unsigned int nvml_index, int64_t pid) {
  NvmlDevice device = nullptr;
  if (NvmlReturn code = api_->get_handle_by_index(nvml_index, &device); code != kNvmlSuccess) {
    return api_->Error(absl::StrCat("nvmlDeviceGetHandleByIndex_v2(", nvml_index, ")"), code);
  }
  return BytesOn(device, absl::StrCat("cuda:", nvml_index), pid);
}

absl::StatusOr<int64_t> NvmlProcessMemory::BytesOn(void* device, const std::string& where, int64_t pid) {
  std::vector<nvmlProcessInfo_t> processes(kInitialProcesses);
  NvmlReturn code = kNvmlErrorInsufficientSize;
  unsigned int count = 0;
  // Processes may start between the driver saying how many there are and the next call.
  for (int attempt = 0; attempt < 4 && code == kNvmlErrorInsufficientSize; ++attempt) {
    count = static_cast<unsigned int>(processes.size());
    code = api_->get_compute_processes(static_cast<NvmlDevice>(device), &count, processes.data());
    if (code == kNvmlErrorInsufficientSize) processes.resize(std::max<size_t>(count, processes.size()) * 2);
  }
  if (code != kNvmlSuccess) {
    return api_->Error(absl::StrCat(api_->compute_processes_name, "(", where, ")"), code);
  }
  // A process has one record per GPU, or one per GPU instance it uses on a MIG-partitioned GPU.
  int64_t bytes = 0;
  bool listed = false;
  for (unsigned int i = 0; i < count && i < processes.size(); ++i) {
    if (static_cast<int64_t>(processes[i].pid) != pid) continue;
    if (processes[i].usedGpuMemory == kValueNotAvailable) {
      return absl::UnavailableError(
          absl::StrCat("NVML does not know process ", pid, "'s memory on ", where, " (no permission?)"));
    }
    listed = true;
    bytes += static_cast<int64_t>(processes[i].usedGpuMemory);
  }
  if (!listed) {
    return absl::NotFoundError(absl::StrCat("NVML lists no process ", pid, " on ", where,
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

ProcessFootprintSampler::ProcessFootprintSampler(ProcessGpuMemoryReader* reader, unsigned int nvml_index, int64_t pid,
                                                 absl::Duration interval)
    : reader_(reader), nvml_index_(nvml_index), pid_(pid) {
  thread_ = std::thread([this, interval] {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval)) {
      mu_.Unlock();
      SampleOnce();
      mu_.Lock();
    }
  });
}

ProcessFootprintSampler::~ProcessFootprintSampler() { Stop(); }

void ProcessFootprintSampler::SampleOnce() {
  // Not listed (not on the GPU yet, or gone): nothing to add.
  absl::StatusOr<int64_t> bytes = reader_->ProcessBytesAtIndex(nvml_index_, pid_);
  if (!bytes.ok()) return;
  absl::MutexLock lock(&mu_);
  peak_ = std::max(peak_, *bytes);
}

int64_t ProcessFootprintSampler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) {
    thread_.join();
    SampleOnce();
  }
  absl::MutexLock lock(&mu_);
  return peak_;
}

int64_t ProcessFootprintSampler::peak() {
  absl::MutexLock lock(&mu_);
  return peak_;
}

std::string DeviceMemoryGauge::Describe() const {
  if (fallback_reason_.empty()) {
    return absl::StrCat("process ", pid_, "'s own memory on the GPU at ", pci_bus_id_, " (NVML)");
  }
  return absl::StrCat("the whole device's used memory (cudaMemGetInfo), other processes' included: ",
                      fallback_reason_);
}

}  // namespace fitrun::worker
