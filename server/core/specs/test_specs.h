// What the core's tests share about the built-in MLP on Debian's Fashion-MNIST: its job spec (SGD) and
// what the memory probe measures for it.
#ifndef FITRUN_SERVER_CORE_SPECS_TEST_SPECS_H_
#define FITRUN_SERVER_CORE_SPECS_TEST_SPECS_H_

#include <algorithm>
#include <cstdint>

#include "fitrun/v1/job.pb.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

// One epoch of the mlp with SGD (lr 0.1, momentum 0.9) on `min_devices`..`max_devices` devices (0: any),
// with the spec defaults applied as NormalizeJobSpec would. Tests change what they are about.
inline fitrun::v1::JobSpec MlpTestSpec(int64_t global_batch = 256, int min_devices = 1, int max_devices = 0) {
  fitrun::v1::JobSpec spec;
  spec.set_name("t");
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
  // What admission reads from Debian's dataset-fashion-mnist at submit.
  spec.mutable_file_facts()->set_image_samples(60000);
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

// The mlp's peak at micro-batch b as fitrun-worker --probe measured it (SGD with momentum, fp32): 5192
// bytes per sample up to 128, then a kernel's scratch makes it steeper, 11336 bytes per sample from
// 1024 on.
inline int64_t MlpPeakBytes(int64_t b) {
  if (b <= 128) return 9644168 + 5192 * b;
  if (b <= 256) return 10308744 + 9032 * (b - 128);
  if (b <= 512) return 11464840 + 9288 * (b - 256);
  if (b <= 1024) return 13842568 + 11332 * (b - 512);
  return 19644552 + 11336 * (b - 1024);
}

// The same with Adam: its optimizer step's temporaries hold the peak at 13.9 MB up to about 140.
inline int64_t AdamMlpPeakBytes(int64_t b) {
  return std::max<int64_t>(13926576, MlpPeakBytes(b) - 9644168 + 12322992);
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_TEST_SPECS_H_
