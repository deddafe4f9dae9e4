#ifndef FITRUN_WORKER_MODELS_MODEL_H_
#define FITRUN_WORKER_MODELS_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "worker/data/tensor_dataset.h"

namespace fitrun::worker {

// The result of evaluating a model on its test split.
struct Evaluation {
  // Set when the workload has an accuracy-like figure the coordinator can show as test_accuracy:
  // top-1 accuracy for classifiers, hit-rate@10 for sasrec. Unset for language models.
  std::optional<double> accuracy;
  // Every figure by name ("test_loss", "hr@10", "ndcg@10"), for the job's result.
  std::map<std::string, double> metrics;
  // Every figure, in words, for the job's log ("test loss 2.31 nats/byte, ...").
  std::string summary;
};

// A batch's inputs, in the order the model's forward takes them (TensorDataset::inputs' rows).
using ModelInputs = std::vector<at::Tensor>;

// What the trainer needs from a model: a module (parameters, buffers, train/eval mode), the loss of
// a batch and an evaluation of a test split. The defaults are those of an image classifier
// (cross-entropy on Forward's logits, top-1 accuracy); other workloads override Loss and Evaluate
// because their batches are not (input, class) pairs. Not thread-safe: owned by the training thread.
class Model : public torch::nn::Module {
 public:
  explicit Model(const std::string& name) : torch::nn::Module(name) {}

  // The model's output for a batch: logits [batch, classes] for the classifiers (one input, images
  // [batch, 1, 28, 28]); see each model for the others.
  virtual at::Tensor Forward(const ModelInputs& inputs) = 0;

  // The scalar training loss of a batch: rows of TensorDataset::inputs and ::targets.
  virtual at::Tensor Loss(const ModelInputs& inputs, const at::Tensor& targets);

  // Evaluates on `test` in batches of `batch` rows, without gradients and in eval mode.
  virtual absl::StatusOr<Evaluation> Evaluate(const TensorDataset& test, int64_t batch);

 protected:
  // What every Evaluate shares: `visit` sees `test` in batches of `batch` rows, without gradients and
  // in eval mode (the mode before is restored); an empty set, a batch below 1 or a LibTorch error
  // becomes a status.
  absl::Status ForEachTestBatch(const TensorDataset& test, int64_t batch,
                                const std::function<void(const TensorDataset& rows)>& visit);
};

// Builds the image classifier a spec names (mlp or cnn), with weights drawn after
// torch::manual_seed(seed) so that every rank starts from the same weights even before rank 0's
// broadcast. Every other model comes with its data from LoadWorkload (worker/models/workload.h).
absl::StatusOr<std::shared_ptr<Model>> CreateModel(const fitrun::v1::ModelSpec& spec, uint64_t seed);

// FNV-1a 64-bit over every parameter's raw bytes in registration order, as 16 lowercase hex digits:
// equal across ranks iff their parameters are bitwise equal.
std::string ParameterChecksum(const torch::nn::Module& module);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_MODEL_H_
