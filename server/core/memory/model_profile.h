// What the coordinator knows about a model and its dataset without running LibTorch: parameter count,
// activation bytes per sample, and how many training samples an epoch has.
#ifndef FITRUN_SERVER_CORE_MEMORY_MODEL_PROFILE_H_
#define FITRUN_SERVER_CORE_MEMORY_MODEL_PROFILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/core/memory/memory_curve.h"

namespace fitrun::server {

// The wall time of one training step (forward, backward, optimizer) at one micro-batch.
struct MeasuredStepTime {
  int64_t batch = 0;
  double seconds = 0;
};

struct ModelProfile {
  int64_t parameter_count = 0;
  // Bytes one sample of the micro-batch adds to a rank's peak: saved activations plus the transient
  // gradients of activations during backward, in fp32 (analytic). The estimator multiplies it by the
  // micro-batch, so raising it (e.g. after an out-of-memory error) raises the batch-dependent part.
  int64_t activation_bytes_per_sample = 0;
  // Bytes of one input sample and its label, as the data loader holds them per micro-batch.
  int64_t input_bytes_per_sample = 0;
  int64_t train_samples = 0;
  // The model recomputes each block's activations in backward (activation checkpointing), which the
  // activation figures above count.
  bool activation_checkpointing = false;
  // The same model recomputing its blocks' activations, where the plan may choose that (the spec
  // leaves it open); null otherwise. Planned on its own figures, analytic or measured.
  std::shared_ptr<const ModelProfile> recomputing;
  // What a step costs, for weighing strategies: the wall time of the probe's steps at the micro-batches
  // it timed (sorted by batch; none where untimed), and what recomputing the blocks adds to a sample's
  // forward and backward (their forward: analytic FLOPs, as a share of the whole).
  std::vector<MeasuredStepTime> step_times;
  double recompute_share = 0;
  // Set from the memory probe's measurements (server/core/calibration/memory_calibration.h): a rank's peak at a
  // micro-batch is then read off this curve (already corrected by real runs' peaks), with the
  // estimator's small calibrated margin instead of its analytic overheads.
  std::optional<MemoryCurve> measured;
  // Where the memory figures came from, for the plan's reasons.
  std::string memory_source;
  // A script nothing has measured yet (no run, no probe): no estimate exists, so a plan takes the
  // largest per-device batch the spec and its limits allow on the devices' whole memory, predicts no
  // peak, and its ranks' first steps measure it (a plan from the run). Cleared once an out-of-memory
  // error bounds it (memory_feedback.h).
  bool memory_unmeasured = false;
  // Whether a plan has nothing to go on: unmeasured, and no measured curve stands in.
  bool Unmeasured() const { return memory_unmeasured && !measured.has_value(); }
  // Set when the planner cannot choose a per-device batch from these figures (a script whose memory
  // does not follow the batch, or that could not be measured): why, and the fix. A spec that fixes
  // resources.per_device_batch still plans.
  std::string batch_not_plannable;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_MODEL_PROFILE_H_
