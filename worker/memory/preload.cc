// libfitrun_memory.so: the capped CPU allocator for processes fitrun does not build, chiefly a script
// rank's Python. The launcher preloads it (LD_PRELOAD); because it links the same LibTorch that
// Debian's python3-torch loads, the allocator it installs is the one every CPU tensor Python creates
// goes through, so a script rank gets the same memory budget, the same OutOfMemoryError (which Python
// raises as torch.cuda.OutOfMemoryError) and the same peak measurement as a fitrun-worker rank.
//
// The process is not ours to configure by flags, so the environment of the launch contract says what
// to do: FITRUN_MEMORY_CAP_BYTES (absent, empty or 0: count only) and FITRUN_MEMORY_METER_FD (the
// supervisor's memory meter, proto/contract/memory_meter.h: the figures go there as the peak rises,
// when a request is refused, and at exit, so the supervisor reads them while the script trains). A
// script reads the counters live through the C functions below (ctypes.CDLL(None) finds them,
// preloaded symbols being global).
//
// Deliberately only LibTorch and libc: the library lands in every process the launcher starts.

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "proto/contract/launch_contract.h"
#include "proto/contract/memory_meter.h"
#include "worker/memory/capped_allocator.h"

namespace {

namespace launch = ::fitrun::contract::launch;
namespace meter = ::fitrun::contract::meter;
using ::fitrun::worker::CappedCpuAllocator;

// Never freed: LibTorch keeps pointing at it until the process is gone, and threads or other libraries'
// destructors may still allocate through it after ours have run.
CappedCpuAllocator* g_allocator = nullptr;
// The supervisor's meter; nullptr when it gave none, and in a forked child (a DataLoader worker),
// which inherits the allocator and the mapping but not the right to report the parent's figures.
meter::MemoryMeter* g_meter = nullptr;

void Publish(const CappedCpuAllocator& allocator) {
  meter::MemoryMeter* page = g_meter;
  if (page == nullptr) return;
  page->live_bytes.store(allocator.Live(), std::memory_order_relaxed);
  page->refused_bytes.store(allocator.LastFailedRequest(), std::memory_order_relaxed);
  page->live_at_refusal.store(allocator.LiveAtLastFailure(), std::memory_order_relaxed);
  page->peak_bytes.store(allocator.Peak(), std::memory_order_relaxed);
}

void ForgetMeterInChild() { g_meter = nullptr; }

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

// Runs after LibTorch's own static initialisers (this library lists libc10 and libtorch_cpu as
// NEEDED, and the loader initialises dependencies first), so the default allocator it wraps exists.
// Its priority beats the default's, so a LibTorch library loaded later (Python's torch._C) that
// registers the default again does not displace it.
__attribute__((constructor)) void InstallCappedAllocator() {
  g_allocator = new CappedCpuAllocator(CapBytesFromEnvironment());
  g_meter = meter::MapFromEnvironment();
  if (g_meter != nullptr) {
    g_meter->writer.store(meter::kWriterCpuAllocator, std::memory_order_relaxed);
    pthread_atfork(nullptr, nullptr, &ForgetMeterInChild);
    g_allocator->SetChangeObserver(&Publish);
  }
  g_allocator->Install();
}

// After Python's own shutdown (exit() runs library destructors last): the live bytes as they ended.
__attribute__((destructor)) void PublishAtExit() {
  if (g_allocator != nullptr) Publish(*g_allocator);
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
