// libfitrun_memory.so: the capped CPU allocator for processes fitrun does not build, chiefly a script
// rank's Python. The launcher preloads it (LD_PRELOAD); because it links the same LibTorch that
// Debian's python3-torch loads, the allocator it installs is the one every CPU tensor Python creates
// goes through, so a script rank gets the same memory budget, the same OutOfMemoryError (which Python
// raises as torch.cuda.OutOfMemoryError) and the same peak measurement as a fitrun-worker rank.
//
// The process is not ours to configure by flags, so the environment of the launch contract says what
// to do: FITRUN_MEMORY_CAP_BYTES (absent, empty or 0: count only) and FITRUN_MEMORY_PEAK_FILE (where
// "<peak bytes> <live bytes>\n" goes at exit). A script reads the counters live through the C
// functions below (ctypes.CDLL(None) finds them, preloaded symbols being global).
//
// Deliberately only LibTorch and libc: the library lands in every process the launcher starts.

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "proto/contract/launch_contract.h"
#include "worker/memory/capped_allocator.h"

namespace {

namespace launch = ::fitrun::contract::launch;
using ::fitrun::worker::CappedCpuAllocator;

// Never freed: LibTorch keeps pointing at it until the process is gone, and threads or other libraries'
// destructors may still allocate through it after ours have run.
CappedCpuAllocator* g_allocator = nullptr;
// A forked child (a DataLoader worker) inherits the allocator but not the right to report the
// parent's peak.
pid_t g_installing_pid = 0;

// A bad value must not stop the training process (the rank would fail for a launcher's mistake), but
// it must be said: the script then runs without the budget its plan assumed.
int64_t CapBytesFromEnvironment() {
  const char* value = std::getenv(launch::kMemoryCapBytes);
  if (value == nullptr || *value == '\0') return 0;
  errno = 0;
  char* end = nullptr;
  const long long cap = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || cap < 0) {
    std::fprintf(stderr,
                 "libfitrun_memory.so: %s=\"%s\" is not a byte count (a whole number >= 0, 0 for no cap); "
                 "counting memory without a cap\n",
                 launch::kMemoryCapBytes, value);
    return 0;
  }
  return static_cast<int64_t>(cap);
}

// Through a temporary file and rename, so the launcher never reads half a line from a process that
// died while writing.
void WritePeakFile(const char* path, int64_t peak, int64_t live, int64_t refused, int64_t live_at_refusal) {
  const std::string temporary = std::string(path) + ".tmp";
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) {
    std::fprintf(stderr, "libfitrun_memory.so: cannot write %s=%s: %s\n", launch::kMemoryPeakFile, path,
                 std::strerror(errno));
    return;
  }
  const bool written = std::fprintf(file, "%lld %lld %lld %lld\n", static_cast<long long>(peak),
                                    static_cast<long long>(live), static_cast<long long>(refused),
                                    static_cast<long long>(live_at_refusal)) > 0;
  if (std::fclose(file) != 0 || !written || std::rename(temporary.c_str(), path) != 0) {
    std::fprintf(stderr, "libfitrun_memory.so: cannot write %s=%s: %s\n", launch::kMemoryPeakFile, path,
                 std::strerror(errno));
    std::remove(temporary.c_str());
  }
}

// Runs after LibTorch's own static initialisers (this library lists libc10 and libtorch_cpu as
// NEEDED, and the loader initialises dependencies first), so the default allocator it wraps exists.
// Its priority beats the default's, so a LibTorch library loaded later (Python's torch._C) that
// registers the default again does not displace it.
__attribute__((constructor)) void InstallCappedAllocator() {
  g_allocator = new CappedCpuAllocator(CapBytesFromEnvironment());
  g_allocator->Install();
  g_installing_pid = getpid();
}

// After Python's own shutdown (exit() runs library destructors last), so the peak covers the whole run.
__attribute__((destructor)) void ReportPeak() {
  const char* path = std::getenv(launch::kMemoryPeakFile);
  if (g_allocator == nullptr || path == nullptr || *path == '\0' || getpid() != g_installing_pid) return;
  WritePeakFile(path, g_allocator->Peak(), g_allocator->Live(), g_allocator->LastFailedRequest(),
                g_allocator->LiveAtLastFailure());
}

}  // namespace

// For ctypes; each mirrors the CappedCpuAllocator accessor of the same name.
extern "C" {

__attribute__((visibility("default"))) int64_t fitrun_memory_live(void) { return g_allocator->Live(); }
__attribute__((visibility("default"))) int64_t fitrun_memory_peak(void) { return g_allocator->Peak(); }
__attribute__((visibility("default"))) int64_t fitrun_memory_cap(void) { return g_allocator->cap_bytes(); }
__attribute__((visibility("default"))) void fitrun_memory_reset_peak(void) { g_allocator->ResetPeak(); }
__attribute__((visibility("default"))) int64_t fitrun_memory_last_failed_request(void) {
  return g_allocator->LastFailedRequest();
}
__attribute__((visibility("default"))) int64_t fitrun_memory_live_at_last_failure(void) {
  return g_allocator->LiveAtLastFailure();
}

}  // extern "C"
