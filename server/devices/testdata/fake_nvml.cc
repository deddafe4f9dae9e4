// A stand-in for libnvidia-ml.so: the NVML entry points NvmlDevices uses, over two fixed devices.
// Tests open the same library with dlopen (the loader shares one copy) and steer it through the
// FakeNvml* setters.
#include <cstring>

namespace {

struct FakeDevice {
  const char* name;
  const char* uuid;
  unsigned long long total;
  unsigned long long free;
  unsigned int gpu_percent;
};

FakeDevice devices[2];
int init_result = 0;
int memory_info_result = 0;
bool initialized = false;

void ResetDevices() {
  devices[0] = {"Fake GPU A100-SXM4-40GB", "GPU-00000000-1111-2222-3333-444444444444", 40ULL << 30, 39ULL << 30, 0};
  devices[1] = {"Fake GPU A100-SXM4-80GB", "GPU-55555555-6666-7777-8888-999999999999", 80ULL << 30, 60ULL << 30, 35};
}

struct Init {
  Init() { ResetDevices(); }
} init_devices;

int CopyString(const char* text, char* out, unsigned int length) {
  if (std::strlen(text) + 1 > length) return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  std::strcpy(out, text);
  return 0;
}

FakeDevice* Device(void* handle) { return static_cast<FakeDevice*>(handle); }

}  // namespace

extern "C" {

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};

// Test controls.
void FakeNvmlReset() {
  ResetDevices();
  init_result = 0;
  memory_info_result = 0;
}
void FakeNvmlSetInitResult(int result) { init_result = result; }
void FakeNvmlSetMemoryInfoResult(int result) { memory_info_result = result; }
void FakeNvmlSetFreeBytes(unsigned int index, unsigned long long free) { devices[index].free = free; }
int FakeNvmlIsInitialized() { return initialized ? 1 : 0; }

// NVML.
const char* nvmlErrorString(int result) {
  switch (result) {
    case 0: return "Success";
    case 3: return "Not Supported";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}
int nvmlInit_v2() {
  if (init_result != 0) return init_result;
  initialized = true;
  return 0;
}
int nvmlShutdown() {
  if (!initialized) return 1;  // NVML_ERROR_UNINITIALIZED
  initialized = false;
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialized) return 1;
  *count = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** handle) {
  if (!initialized) return 1;
  if (index >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *handle = &devices[index];
  return 0;
}
int nvmlDeviceGetName(void* handle, char* name, unsigned int length) {
  return CopyString(Device(handle)->name, name, length);
}
int nvmlDeviceGetUUID(void* handle, char* uuid, unsigned int length) {
  return CopyString(Device(handle)->uuid, uuid, length);
}
int nvmlDeviceGetMemoryInfo(void* handle, nvmlMemory_t* memory) {
  if (memory_info_result != 0) return memory_info_result;
  const FakeDevice& device = *Device(handle);
  *memory = {device.total, device.free, device.total - device.free};
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* handle, nvmlUtilization_t* utilization) {
  *utilization = {Device(handle)->gpu_percent, Device(handle)->gpu_percent / 2};
  return 0;
}

}  // extern "C"
