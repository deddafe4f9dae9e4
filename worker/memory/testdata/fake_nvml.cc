// A stand-in for libnvidia-ml.so: the NVML entry points NvmlProcessMemory uses, over two GPUs whose
// running processes a test sets. Tests open the same library with dlopen (the loader shares one
// copy) and steer it through the FakeNvml* setters.
#include <cstring>
#include <strings.h>
#include <vector>

namespace {

struct FakeProcess {
  unsigned int pid;
  unsigned long long used_bytes;
};

struct FakeGpu {
  const char* bus_id;  // NVML's own spelling: an 8-digit domain
  std::vector<FakeProcess> processes;
};

FakeGpu gpus[2] = {{"00000000:17:00.0", {}}, {"00000000:65:00.0", {}}};
bool initialized = false;

// NVML takes a bus id with a domain of any width ("0000:65:00.0", as CUDA writes it, or NVML's own
// "00000000:65:00.0"): the GPU is the one whose bus, device and function match.
FakeGpu* GpuAt(const char* bus_id) {
  const char* wanted = std::strchr(bus_id, ':');
  for (FakeGpu& gpu : gpus) {
    const char* own = std::strchr(gpu.bus_id, ':');
    if (wanted != nullptr && strcasecmp(own, wanted) == 0) return &gpu;
  }
  return nullptr;
}

}  // namespace

extern "C" {

struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

// Test controls.
void FakeNvmlReset() {
  for (FakeGpu& gpu : gpus) gpu.processes.clear();
}
void FakeNvmlAddProcess(unsigned int gpu, unsigned int pid, unsigned long long used_bytes) {
  gpus[gpu].processes.push_back({pid, used_bytes});
}
int FakeNvmlIsInitialized() { return initialized ? 1 : 0; }

// NVML.
const char* nvmlErrorString(int result) {
  switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    default: return "Unknown Error";
  }
}
int nvmlInit_v2() {
  initialized = true;
  return 0;
}
int nvmlShutdown() {
  if (!initialized) return 1;  // NVML_ERROR_UNINITIALIZED
  initialized = false;
  return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** handle) {
  if (!initialized) return 1;
  FakeGpu* gpu = GpuAt(bus_id);
  if (gpu == nullptr) return 6;  // NVML_ERROR_NOT_FOUND
  *handle = gpu;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** handle) {
  if (!initialized) return 1;
  if (index >= 2) return 6;  // NVML_ERROR_NOT_FOUND
  *handle = &gpus[index];
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void* handle, unsigned int* count, nvmlProcessInfo_t* infos) {
  if (!initialized) return 1;
  const std::vector<FakeProcess>& processes = static_cast<FakeGpu*>(handle)->processes;
  if (*count < processes.size()) {
    *count = static_cast<unsigned int>(processes.size());
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  *count = static_cast<unsigned int>(processes.size());
  for (size_t i = 0; i < processes.size(); ++i) infos[i] = {processes[i].pid, processes[i].used_bytes, 0, 0};
  return 0;
}

}  // extern "C"
