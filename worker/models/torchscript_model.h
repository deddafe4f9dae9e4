#ifndef FITRUN_WORKER_MODELS_TORCHSCRIPT_MODEL_H_
#define FITRUN_WORKER_MODELS_TORCHSCRIPT_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "worker/data/tensor_dataset.h"
#include "worker/models/model.h"

namespace fitrun::worker {

// A user's TorchScript module (torch.jit.script(module).save(path)) trained by the worker: its
// forward takes a batch's inputs in the dataset's order (TensorDataset::inputs) and returns what the
// spec's loss (worker/models/losses.h) compares with the targets; loss: module calls the module's
// own compute_loss(output, target). Every parameter must be float32. The module's parameters and
// floating-point buffers are registered as this Model's own (the same tensors, not copies), so the
// optimizer, the gradient synchronizer, rank 0's broadcast and the checksum treat them like a
// builtin's. train()/eval() reach the module; Evaluate reports the loss's test figures.
//
// Loading runs forward and the loss once on `sample` (two training rows) to check the contract
// before any rendezvous; errors name spec.model.torchscript or spec.loss and what was found.
absl::StatusOr<std::shared_ptr<Model>> LoadTorchScriptModel(const std::string& path, const fitrun::v1::LossSpec& loss,
                                                            const TensorDataset& sample, uint64_t seed);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_TORCHSCRIPT_MODEL_H_
