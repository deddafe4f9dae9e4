// What a memory probe says to fitrund, whichever program measures (the built-in models' probe in
// fitrun-worker, or a script's probe in fitrun-worker or fitrun-supervisor): one JSON object per line
// on stdout, first what the probe loaded,
//   {"model_state_bytes": N, "train_samples": T}
// then one line per measured batch,
//   {"batch": B, "peak_bytes": P, "backward_peak_bytes": P1, "other_peak_bytes": P2, "step_seconds": S}
// or, when a measurement fails, {"batch": B, "error": "..."} (with "out_of_memory": true when it
// needed more than the budget). Batch sizes come from --probe_batches or one per line of stdin.
// Needs no LibTorch.
#ifndef FITRUN_WORKER_PROBE_PROBE_PROTOCOL_H_
#define FITRUN_WORKER_PROBE_PROBE_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/worker.pb.h"

namespace fitrun::worker {

// One measurement: the peak of a few real training steps at one micro-batch size.
struct ProbePeak {
  int64_t batch = 0;
  int64_t peak_bytes = 0;           // the step's peak: the larger of the two below
  int64_t backward_peak_bytes = 0;  // during backward (saved activations and their gradients)
  int64_t other_peak_bytes = 0;     // the rest of the step: forward, optimizer step, zero_grad
  // The wall time of the last step measured (its allocations warm); 0 where not timed (a script).
  double step_seconds = 0;
};

std::string ProbeHeaderJson(int64_t model_state_bytes, int64_t train_samples);
std::string ProbePeakJson(const ProbePeak& peak);
std::string ProbeErrorJson(int64_t batch, const absl::Status& status);

// Prints `header`, then runs `measure` on each of `batches`, or of stdin when empty, printing one line
// each as soon as it is done. A batch past the budget is an answer (fitrund measures smaller ones
// next); any other failure ends the probe.
absl::Status MeasureAll(const std::string& header, const std::function<absl::StatusOr<ProbePeak>(int64_t)>& measure,
                        const std::vector<int64_t>& batches);

// The assignment FITRUN_ASSIGNMENT names (the probe reads nothing else of the launch contract).
absl::StatusOr<fitrun::v1::WorkerAssignment> LoadProbeAssignment();

// The exit code for a probe that ended with `status`, which is printed on stderr after `program`.
int ProbeExitCode(const std::string& program, const absl::Status& status);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROBE_PROBE_PROTOCOL_H_
