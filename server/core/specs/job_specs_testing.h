// What the spec tests share: the documented example spec, and a spec parsed and normalized as a
// submit does it.
#ifndef FITRUN_SERVER_CORE_SPECS_JOB_SPECS_TESTING_H_
#define FITRUN_SERVER_CORE_SPECS_JOB_SPECS_TESTING_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

inline constexpr char kValidYaml[] = R"(
name: fashion-mnist-mlp
model: {builtin: mlp}
data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9, lr_scaling: none}
global_batch_size: 256
epochs: 1
precision: fp32
resources: {min_devices: 1, max_devices: 2}
)";

inline absl::StatusOr<fitrun::v1::JobSpec> Normalize(const std::string& yaml) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  if (!spec.ok()) return spec.status();
  return NormalizeJobSpec(*spec);
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_JOB_SPECS_TESTING_H_
