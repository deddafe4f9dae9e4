// What the core's tests share about the built-in MLP on Debian's Fashion-MNIST: its job spec (SGD) and
// what the memory probe measures for it.
#ifndef FITRUN_SERVER_CORE_TEST_SPECS_H_
#define FITRUN_SERVER_CORE_TEST_SPECS_H_

#include <cstdint>

#include "fitrun/v1/job.pb.h"
#include "server/core/job_spec.h"
#include "server/core/memory_calibration.h"

namespace fitrun::server {

// One epoch of the mlp with SGD (lr 0.1, momentum 0.9) on `min_devices`..`max_devices` devices (0: any),
// with the spec defaults applied as NormalizeJobSpec would. Tests change what they are about.
inline fitrun::v1::JobSpec MlpTestSpec(int64_t global_batch = 256, int min_devices = 1, int max_devices = 0) {
  fitrun::v1::JobSpec spec;
  spec.set_name("t");
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
  spec.mutable_optimizer()->set_lr(0.1);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_global_batch_size(global_batch);
  spec.set_epochs(1);
  spec.mutable_resources()->set_min_devices(min_devices);
  spec.mutable_resources()->set_max_devices(max_devices);
  ApplyJobSpecDefaults(spec);
  return spec;
}

// The mlp's real probe figures (fitrun-worker --probe, SGD with momentum, fp32), as measured between the
// given micro-batch sizes.
inline ProbeResult MlpProbeResult(int64_t small_batch, int64_t large_batch) {
  ProbeResult r;
  r.fixed_bytes = 12322992;
  r.per_sample_bytes = 5192;
  r.model_state_bytes = 2678824;
  r.small_batch = small_batch;
  r.large_batch = large_batch;
  return r;
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_TEST_SPECS_H_
