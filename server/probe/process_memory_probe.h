// MemoryProbe over a child process: `fitrun-worker --probe` (worker/probe/memory_probe.h) loads the
// spec's workload once, then measures the peak of real training steps at each micro-batch size it
// reads on stdin, answering one JSON line per batch. fitrund does not link LibTorch, so measuring is
// the worker's job; deciding what to measure is the calibration's (server/core/memory/memory_curve.h).
//
// No shell: a child (as the job's owner's Unix account when it has one, see server/spawn) with the
// coordinator's environment plus FITRUN_ASSIGNMENT (a one-rank
// assignment written to a file under work_dir, whose memory cap is the session's byte budget, which
// the worker's counting allocator enforces), stdin/stdout/stderr through pipes, SIGKILL at a
// timeout. Thread-safe: each session is its own process, used by one thread.
#ifndef FITRUN_SERVER_PROBE_PROCESS_MEMORY_PROBE_H_
#define FITRUN_SERVER_PROBE_PROCESS_MEMORY_PROBE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/sandbox/job_cgroup.h"
#include "server/sandbox/owned_directory.h"

namespace fitrun::server {

class ProcessMemoryProbe : public MemoryProbe {
 public:
  struct Options {
    std::string worker_binary;
    // What probes a script job's workload: fitrun-supervisor, which loads no LibTorch beside the
    // script's own; empty: worker_binary.
    std::string script_binary;
    // The GPU a probe uses ("cuda:0", or a slice "cuda:0#1"; empty: none, the host): a script's one
    // probe rank runs on it, where the fitrun module measures torch.cuda's allocated peak (a script
    // keeps its tensors on its GPU, where the host's preloaded allocator sees none of them); a
    // built-in workload's memory is still measured on the host, by the counting allocator, but its
    // steps are timed on this GPU, so that the plan weighs strategies by the GPU's step times.
    std::string probe_device_id;
    // Where the probes' assignment files go (created if missing).
    std::string work_dir;
    // The ranks' decoded-dataset cache (WorkerAssignment.dataset_cache_dir): the probe usually loads a
    // workload's dataset first, and the ranks after it map what it decoded. Empty: none.
    std::string dataset_cache_dir;
    // Threads the probe trains with, as a rank of a virtual CPU device would on this machine.
    int cpu_threads = 1;
    // The probe measures memory, not time: it runs at this niceness (through /usr/bin/nice, so that
    // every thread it starts inherits it) and never takes the CPU from fitrund or training ranks.
    // 0: as fitrund.
    int nice = 10;
    // Where each probe gets a cgroup of its own ("probe-<fitrund's pid>-<n>"), bounded as a rank
    // of the job would be (its spec's host memory, else the probe's budget plus what a rank's
    // process needs beside it, and its tasks) and emptied when the probe ends; nullptr: none.
    // Must outlive the probe.
    JobCgroups* cgroups = nullptr;
    // For loading the workload, and for each measurement.
    absl::Duration start_timeout = absl::Seconds(120);
    absl::Duration measure_timeout = absl::Seconds(180);
  };
  static absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> Create(Options options);

  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> Start(const fitrun::v1::JobSpec& spec, int64_t max_bytes,
                                                            const std::string& run_as) override;

 private:
  explicit ProcessMemoryProbe(Options options) : options_(std::move(options)) {}
  const Options options_;
  std::atomic<int64_t> next_id_{0};
};

// The GPU a probe uses among the devices offered (ProcessMemoryProbe::Options::probe_device_id): the
// one on this machine with the most memory (a cluster node's GPUs, "n1/cuda:0", are not this
// machine's), or empty when this machine offers none.
std::string ProbeDeviceOf(const std::vector<fitrun::v1::Device>& offered);

// One line of fitrun-worker --probe's output, read.
struct ProbeLine {
  // The header line.
  int64_t model_state_bytes = -1;
  int64_t train_samples = -1;
  // A measurement line.
  int64_t batch = -1;
  int64_t peak_bytes = -1;
  double step_seconds = 0;  // its last step's wall time (0: not timed)
  std::string error;        // a failed measurement's message
  bool out_of_memory = false;  // it failed for needing more than the budget
};
// INVALID_ARGUMENT when the line is not the probe's JSON.
absl::StatusOr<ProbeLine> ParseProbeLine(absl::string_view json);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_PROBE_PROCESS_MEMORY_PROBE_H_
