#ifndef FITRUN_WORKER_MODELS_TORCHSCRIPT_MODEL_H_
#define FITRUN_WORKER_MODELS_TORCHSCRIPT_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/models/model.h"

namespace fitrun::worker {

// A user's TorchScript module (torch.jit.script(module).save(path)) trained as an image classifier.
// Contract: forward(x) takes images [B, 1, 28, 28] float32 (normalized Fashion-MNIST) and returns
// logits [B, classes] float32 with classes >= 10; the loss is cross-entropy against the int64 labels.
// Every parameter must be float32. The module's parameters and floating-point buffers are registered
// as this Model's own (the same tensors, not copies), so the optimizer, the gradient synchronizer,
// rank 0's broadcast and the checksum treat them like a builtin's. train()/eval() reach the module.
//
// Loading runs forward once on two blank images to check the contract before any rendezvous;
// errors name spec.model.torchscript.
absl::StatusOr<std::shared_ptr<Model>> LoadTorchScriptModel(const std::string& path, uint64_t seed);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_TORCHSCRIPT_MODEL_H_
