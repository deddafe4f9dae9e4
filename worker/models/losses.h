#ifndef FITRUN_WORKER_MODELS_LOSSES_H_
#define FITRUN_WORKER_MODELS_LOSSES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "worker/models/model.h"

namespace fitrun::worker {

// What a TorchScript model is trained to minimise (spec.loss) and the test figures that go with it:
//
//   cross_entropy    class scores [N, C] against int64 classes [N], or [N, ..., C] (the class
//                    dimension last, as a transformer's logits) against [N, ...]; targets equal to
//                    ignore_index count in neither the loss nor the accuracy. Test: loss, top-1 accuracy.
//   mse, l1,         output and target of one shape (an output [N, 1] against a target [N] is
//   smooth_l1        squeezed), compared as float32. Test: loss (mean squared / absolute error).
//   bce_with_logits  the same shapes, targets in [0, 1]. Test: loss, accuracy of (output > 0) against
//                    (target > 0.5).
//   module           the module's own compute_loss(output, target), a scalar. Test: loss.
//
// Each loss is a mean over what it counts; Evaluate-time sums weight every batch by that count.
// Instances are used by one thread (the training thread).
class LossFunction {
 public:
  virtual ~LossFunction() = default;
  // The scalar loss of a batch.
  virtual at::Tensor Compute(const at::Tensor& output, const at::Tensor& target) const = 0;

  // Evaluation over batches: Add each, then Result.
  struct Totals {
    double loss_sum = 0;  // each batch's mean loss times its count
    double counted = 0;   // samples (or positions) the loss counted
    double correct = 0;   // for the losses with an accuracy
  };
  virtual void Add(const at::Tensor& output, const at::Tensor& target, Totals& totals) const = 0;
  // The figures: test_loss always, an accuracy where the loss has one, and the loss's own name
  // ("test_mse", "test_mae") where it reads better.
  virtual Evaluation Result(const Totals& totals) const = 0;
};

// Calls a module method: `compute_loss` of a TorchScript module, for loss: module.
using ModuleLossMethod = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

// The loss a spec names (unspecified: cross_entropy). `module_loss` is required for loss: module.
absl::StatusOr<std::unique_ptr<LossFunction>> MakeLoss(const fitrun::v1::LossSpec& spec, ModuleLossMethod module_loss);

// "cross_entropy", "mse", ... as specs name them.
std::string LossName(fitrun::v1::LossKind kind);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_LOSSES_H_
