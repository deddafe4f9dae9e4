// The memory meter: one page of shared memory through which a script rank's memory figures reach
// its supervisor while the script runs, and after it exits.
//
// The supervisor (fitrun-supervisor, or a script probe) creates the page as an anonymous memory file
// (memfd_create), maps it, and hands the script its descriptor in FITRUN_MEMORY_METER_FD. Whoever
// counts the script's memory writes there: on a virtual CPU device the preloaded allocator
// (libfitrun_memory.so) as the peak rises and when it refuses a request; on a GPU the fitrun module,
// with torch.cuda's figures, at each report and at exit. The supervisor reads it whenever it wants a
// figure: for its heartbeats while the script trains, and for the rank's last word when it has
// exited. Nothing has a name another account could take first, fill, or replace (a file at a
// guessable /tmp name could be a FIFO that blocks the reader, or another account's figures).
//
// Everything here is plain C++ and Linux; both sides link it. client/python/fitrun/contract.py
// mirrors the layout (METER_* offsets), checked by //client/python:run_test.
#ifndef FITRUN_PROTO_CONTRACT_MEMORY_METER_H_
#define FITRUN_PROTO_CONTRACT_MEMORY_METER_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace fitrun::contract::meter {

// The environment variable naming the page's descriptor in the script's process.
inline constexpr char kMemoryMeterFd[] = "FITRUN_MEMORY_METER_FD";

// Who wrote the figures (MemoryMeter::writer).
inline constexpr int64_t kWriterNone = 0;
inline constexpr int64_t kWriterCpuAllocator = 1;  // libfitrun_memory.so, counting CPU tensors
inline constexpr int64_t kWriterCudaModule = 2;    // the fitrun module, from torch.cuda's statistics

// The page. Each field is a naturally aligned 64-bit integer at a fixed offset (the Python module
// writes them with struct.pack_into), read and written whole.
struct MemoryMeter {
  std::atomic<int64_t> peak_bytes;       // offset 0: the highest live bytes so far
  std::atomic<int64_t> live_bytes;       // 8: live bytes when last written
  std::atomic<int64_t> refused_bytes;    // 16: the last request refused for the cap (0: none)
  std::atomic<int64_t> live_at_refusal;  // 24: live bytes when it was refused
  std::atomic<int64_t> writer;           // 32: kWriter*
  // 40, on a GPU: the caching allocator's reserved peak, and the device's memory in use at its
  // highest as the module saw it (every process's, cudaMemGetInfo's total minus free).
  std::atomic<int64_t> reserved_peak_bytes;
  std::atomic<int64_t> device_peak_bytes;  // 48
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the page is shared between processes");
static_assert(offsetof(MemoryMeter, writer) == 32 && offsetof(MemoryMeter, device_peak_bytes) == 48,
              "client/python/fitrun/contract.py reads these offsets");

inline constexpr size_t kPageBytes = 4096;

// The figures, copied out of the page.
struct MemoryReading {
  int64_t peak_bytes = 0;
  int64_t live_bytes = 0;
  int64_t refused_bytes = 0;
  int64_t live_at_refusal = 0;
  int64_t writer = kWriterNone;
  int64_t reserved_peak_bytes = 0;
  int64_t device_peak_bytes = 0;
};

inline MemoryReading Read(const MemoryMeter& meter) {
  MemoryReading reading;
  reading.peak_bytes = meter.peak_bytes.load(std::memory_order_relaxed);
  reading.live_bytes = meter.live_bytes.load(std::memory_order_relaxed);
  reading.refused_bytes = meter.refused_bytes.load(std::memory_order_relaxed);
  reading.live_at_refusal = meter.live_at_refusal.load(std::memory_order_relaxed);
  reading.writer = meter.writer.load(std::memory_order_relaxed);
  reading.reserved_peak_bytes = meter.reserved_peak_bytes.load(std::memory_order_relaxed);
  reading.device_peak_bytes = meter.device_peak_bytes.load(std::memory_order_relaxed);
  return reading;
}

// Maps the page behind `fd` (which stays open). nullptr when it is not one (too small, not
// mappable).
inline MemoryMeter* Map(int fd) {
  const off_t size = lseek(fd, 0, SEEK_END);
  if (size < static_cast<off_t>(kPageBytes)) return nullptr;
  void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return page == MAP_FAILED ? nullptr : static_cast<MemoryMeter*>(page);
}

// A new, zeroed page for a script about to start: its descriptor (close-on-exec; the child's copy is
// made inheritable between fork and exec) and its mapping in *meter. -1 with errno set on failure.
inline int Create(MemoryMeter** meter) {
  const int fd = memfd_create("fitrun-memory-meter", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(kPageBytes)) != 0) {
    const int error = errno;
    close(fd);
    errno = error;
    return -1;
  }
  *meter = Map(fd);
  if (*meter == nullptr) {
    const int error = errno;
    close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

// The page named by FITRUN_MEMORY_METER_FD in this process's environment, mapped; nullptr when none
// is named or it cannot be mapped.
inline MemoryMeter* MapFromEnvironment() {
  const char* value = std::getenv(kMemoryMeterFd);
  if (value == nullptr || *value == '\0') return nullptr;
  char* end = nullptr;
  const long fd = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || fd < 0) return nullptr;
  return Map(static_cast<int>(fd));
}

}  // namespace fitrun::contract::meter

#endif  // FITRUN_PROTO_CONTRACT_MEMORY_METER_H_
