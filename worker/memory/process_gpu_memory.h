// A rank's own footprint on its GPU, as the driver counts it: NVML's per-process figure (the CUDA
// context, the caching allocator's segments, cuBLAS's and NCCL's buffers; ../shared/gpu/README.md),
// not the whole device's used memory, which counts every other process on a shared GPU. NVML is
// opened with dlopen when a rank first reads it, so the worker neither links it nor needs an NVIDIA
// header to build (as server/devices/nvml_devices.cc does for fitrund). Needs no LibTorch.
#ifndef FITRUN_WORKER_MEMORY_PROCESS_GPU_MEMORY_H_
#define FITRUN_WORKER_MEMORY_PROCESS_GPU_MEMORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace fitrun::worker {

// Reads how much device memory one process holds on one GPU. The GPU is named by its PCI bus id
// ("0000:17:00.0", as cudaDeviceGetPCIBusId writes it), which names the same GPU whatever
// CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER made of CUDA's device indices.
class ProcessGpuMemoryReader {
 public:
  virtual ~ProcessGpuMemoryReader() = default;
  // The bytes process `pid` holds on that GPU. NotFound when the driver lists no such process there
  // (none yet, or pids of another PID namespace in a container); another error when the driver
  // cannot say.
  virtual absl::StatusOr<int64_t> ProcessBytes(const std::string& pci_bus_id, int64_t pid) = 0;
  // The same, for the GPU at NVML's index `nvml_index`: the one fitrund names cuda:<index>
  // (server/devices/nvml_devices.cc numbers them so), for a process that knows no CUDA.
  virtual absl::StatusOr<int64_t> ProcessBytesAtIndex(unsigned int nvml_index, int64_t pid) = 0;
};

// ProcessGpuMemoryReader over libnvidia-ml: nvmlDeviceGetHandleByPciBusId_v2 and
// nvmlDeviceGetComputeRunningProcesses (_v3, or _v2 on older drivers). Thread-compatible.
class NvmlProcessMemory final : public ProcessGpuMemoryReader {
 public:
  struct Options {
    // The driver's library; tests give a fake one.
    std::string library_path = "libnvidia-ml.so.1";
  };

  // NotFound when the library cannot be opened (no NVIDIA driver), FailedPrecondition when it lacks
  // an entry point used here, Internal when NVML does not initialise.
  static absl::StatusOr<std::unique_ptr<NvmlProcessMemory>> Create(Options options);
  ~NvmlProcessMemory() override;

  NvmlProcessMemory(const NvmlProcessMemory&) = delete;
  NvmlProcessMemory& operator=(const NvmlProcessMemory&) = delete;

  absl::StatusOr<int64_t> ProcessBytes(const std::string& pci_bus_id, int64_t pid) override;
  absl::StatusOr<int64_t> ProcessBytesAtIndex(unsigned int nvml_index, int64_t pid) override;

 private:
  struct Api;
  NvmlProcessMemory();
  // The bytes `pid` holds on `device` (an NVML handle), `where` naming it in errors.
  absl::StatusOr<int64_t> BytesOn(void* device, const std::string& where, int64_t pid);

  std::unique_ptr<Api> api_;  // the loaded library and the entry points read here
};

// One rank's device memory over its run, sampled at each progress report, so that its peak is the
// highest of the samples: this process's own figure from `reader` when it has one, else
// `whole_device` (the device's used memory, cudaMemGetInfo's total minus free, which counts other
// processes too). Once the reader failed, the gauge stays with `whole_device`, so that one peak never
// mixes the two. Belongs to the training thread.
class DeviceMemoryGauge {
 public:
  // `reader` may be null (no NVML) and must outlive the gauge; `whole_device` may fail too, and a
  // sample that nothing could read is 0.
  DeviceMemoryGauge(ProcessGpuMemoryReader* reader, std::string pci_bus_id, int64_t pid,
                    std::function<absl::StatusOr<int64_t>()> whole_device);

  // The figure now (bytes); raises peak() to it.
  int64_t Sample();
  int64_t peak() const { return peak_; }
  // Where the figures come from, for the rank's log; after a fallback, why.
  std::string Describe() const;

 private:
  ProcessGpuMemoryReader* reader_;
  const std::string pci_bus_id_;
  const int64_t pid_;
  const std::function<absl::StatusOr<int64_t>()> whole_device_;
  std::string fallback_reason_;  // empty while the reader is used
  int64_t peak_ = 0;
};

// The highest footprint one process (a script rank's Python) reaches on one GPU, sampled by NVML on a
// thread of its own every `interval` until Stop: what a supervisor that links no CUDA knows of a
// script that reports nothing. The caching allocator keeps what it reserved, so its footprint only
// grows between samples: sampling misses little. Thread-safe.
class ProcessFootprintSampler {
 public:
  // `reader` must outlive the sampler.
  ProcessFootprintSampler(ProcessGpuMemoryReader* reader, unsigned int nvml_index, int64_t pid,
                          absl::Duration interval);
  ~ProcessFootprintSampler();
  // Samples once more and stops sampling; returns the peak (0: NVML never listed the process).
  int64_t Stop();
  // The highest sample so far.
  int64_t peak();

 private:
  void SampleOnce();

  ProcessGpuMemoryReader* const reader_;
  const unsigned int nvml_index_;
  const int64_t pid_;
  absl::Mutex mu_;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MEMORY_PROCESS_GPU_MEMORY_H_
