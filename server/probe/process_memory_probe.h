// MemoryProbe over a child process: `fitrun-worker --probe` (worker/probe/memory_probe.h) runs real
// training steps of the spec at two micro-batch sizes under the worker's counting allocator and
// prints the fitted line as JSON. fitrund does not link LibTorch, so measuring is the worker's job.
//
// No shell: posix_spawn with the coordinator's environment plus FITRUN_ASSIGNMENT (a one-rank
// assignment written to a file under work_dir), stdout and stderr read through pipes, SIGKILL at
// the timeout. Thread-safe: each Probe call is its own process.
#ifndef FITRUN_SERVER_PROBE_PROCESS_MEMORY_PROBE_H_
#define FITRUN_SERVER_PROBE_PROCESS_MEMORY_PROBE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/memory_calibration.h"

namespace fitrun::server {

class ProcessMemoryProbe : public MemoryProbe {
 public:
  struct Options {
    std::string worker_binary;
    // Where the probes' assignment files go (created if missing).
    std::string work_dir;
    // The two micro-batch sizes measured; clamped to the dataset's size by the worker's own check.
    int64_t small_batch = 4;
    int64_t large_batch = 16;
    // Threads the probe trains with, as a rank of a virtual CPU device would on this machine.
    int cpu_threads = 1;
    absl::Duration timeout = absl::Seconds(180);
  };
  static absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> Create(Options options);

  absl::StatusOr<ProbeResult> Probe(const fitrun::v1::JobSpec& spec) override;

 private:
  explicit ProcessMemoryProbe(Options options) : options_(std::move(options)) {}
  const Options options_;
  std::atomic<int64_t> next_id_{0};
};

// Reads fitrun-worker --probe's JSON line; INVALID_ARGUMENT when a field is missing.
absl::StatusOr<ProbeResult> ParseProbeJson(absl::string_view json);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_PROBE_PROCESS_MEMORY_PROBE_H_
