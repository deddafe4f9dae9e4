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
    // The small micro-batch sizes measured first. A second run then measures two large ones, chosen
    // so that activations outweigh the small-batch fixed cost (at least min_large_batch, at most
    // the dataset's size, max_large_batch and max_probe_bytes by the first run's line), since a
    // step's per-sample cost can grow past a small-batch plateau.
    int64_t small_batch = 4;
    int64_t large_batch = 16;
    int64_t min_large_batch = 32;
    int64_t max_large_batch = 4096;
    int64_t max_probe_bytes = 1LL << 30;
    // false: only the small batches (one run), for measuring at exactly large_batch.
    bool large_batches = true;
    // Threads the probe trains with, as a rank of a virtual CPU device would on this machine.
    int cpu_threads = 1;
    absl::Duration timeout = absl::Seconds(180);
  };
  static absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> Create(Options options);

  absl::StatusOr<ProbeResult> Probe(const fitrun::v1::JobSpec& spec) override;

 private:
  // One fitrun-worker --probe run at two batch sizes: its overall peaks as a line.
  absl::StatusOr<ProbeResult> RunOnce(const fitrun::v1::JobSpec& spec, int64_t small_batch, int64_t large_batch);
  explicit ProcessMemoryProbe(Options options) : options_(std::move(options)) {}
  const Options options_;
  std::atomic<int64_t> next_id_{0};
};

// Reads fitrun-worker --probe's JSON line; INVALID_ARGUMENT when a field is missing.
absl::StatusOr<ProbeResult> ParseProbeJson(absl::string_view json);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_PROBE_PROCESS_MEMORY_PROBE_H_
