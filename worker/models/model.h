#ifndef FITRUN_WORKER_MODELS_MODEL_H_
#define FITRUN_WORKER_MODELS_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::worker {

// What the trainer needs from a model: a module (parameters, buffers, train/eval mode) that maps a
// batch of inputs to class logits. Builtin models, TorchScript and transformer families plug in here.
// Not thread-safe: owned by the training thread.
class Model : public torch::nn::Module {
 public:
  explicit Model(const std::string& name) : torch::nn::Module(name) {}

  // Logits [batch, classes] for a batch of inputs (images [batch, 1, 28, 28] for the builtins).
  virtual at::Tensor Forward(const at::Tensor& input) = 0;
};

// Builds the model a spec names, with weights drawn after torch::manual_seed(seed) so that every rank
// starts from the same weights even before rank 0's broadcast.
absl::StatusOr<std::shared_ptr<Model>> CreateModel(const fitrun::v1::ModelSpec& spec, uint64_t seed);

// FNV-1a 64-bit over every parameter's raw bytes in registration order, as 16 lowercase hex digits:
// equal across ranks iff their parameters are bitwise equal.
std::string ParameterChecksum(const torch::nn::Module& module);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_MODEL_H_
