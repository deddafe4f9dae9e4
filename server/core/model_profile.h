// What the coordinator knows about a model and its dataset without running LibTorch: parameter count,
// activation bytes per sample, and how many training samples an epoch has.
#ifndef FITRUN_SERVER_CORE_MODEL_PROFILE_H_
#define FITRUN_SERVER_CORE_MODEL_PROFILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

struct ModelProfile {
  int64_t parameter_count = 0;
  // Bytes one sample of the micro-batch adds to a rank's peak: saved activations plus the transient
  // gradients of activations during backward, in fp32 (analytic), or the probe's measured
  // per-sample bytes (calibrated). Either way the estimator multiplies it by the micro-batch, so
  // scaling it (e.g. after an out-of-memory error) scales the batch-dependent part of the estimate.
  int64_t activation_bytes_per_sample = 0;
  // Bytes of one input sample and its label, as the data loader holds them per micro-batch.
  int64_t input_bytes_per_sample = 0;
  int64_t train_samples = 0;
  // Set from a memory probe (server/core/memory_calibration.h): the rank's peak is then
  // calibrated_fixed_bytes + (activation + input bytes per sample) * b as measured, with the
  // estimator's small calibrated margin instead of its analytic overheads.
  bool calibrated = false;
  int64_t calibrated_fixed_bytes = 0;
  // The small-batch line the peak never goes below (see ProbeResult in memory_calibration.h).
  int64_t calibrated_small_fixed_bytes = 0;
  int64_t calibrated_small_per_sample_bytes = 0;
  // Where the memory figures came from, for the plan's reasons.
  std::string memory_source;
};

// The profile of a spec's model on its dataset; NOT_FOUND for a model the catalog does not know.
absl::StatusOr<ModelProfile> ProfileFor(const fitrun::v1::JobSpec& spec);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MODEL_PROFILE_H_
