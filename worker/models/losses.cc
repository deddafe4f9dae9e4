#include "worker/models/losses.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fitrun::worker {
namespace {

namespace F = torch::nn::functional;

std::string Shape(const at::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); }

// An output of one more dimension than its target carries the classes last: [N, ..., C].
std::pair<at::Tensor, at::Tensor> ClassesLast(const at::Tensor& output, const at::Tensor& target) {
  if (output.dim() == target.dim() + 1 && output.dim() > 2) {
    return {output.reshape({-1, output.size(-1)}), target.reshape({-1})};
  }
  return {output, target};
}

class CrossEntropy final : public LossFunction {
 public:
  explicit CrossEntropy(int64_t ignore_index) : ignore_index_(ignore_index) {}

  at::Tensor Compute(const at::Tensor& output, const at::Tensor& target) const override {
    const auto [scores, classes] = ClassesLast(output, target);
    TORCH_CHECK(scores.dim() == 2 && classes.dim() == 1 && scores.size(0) == classes.size(0),
                "cross_entropy compares class scores [N, C] (or [N, ..., C]) with classes [N] (or [N, ...]); got ",
                Shape(output), " against ", Shape(target));
    TORCH_CHECK(!classes.is_floating_point(), "cross_entropy needs integer classes as its target; got ",
                c10::toString(target.scalar_type()), " (for a regression use loss: mse)");
    return F::cross_entropy(scores.to(at::kFloat), classes.to(at::kLong),
                            F::CrossEntropyFuncOptions().ignore_index(ignore_index_));
  }

  void Add(const at::Tensor& output, const at::Tensor& target, Totals& totals) const override {
    const auto [scores, classes] = ClassesLast(output, target);
    const at::Tensor counted = classes.ne(ignore_index_);
    const double n = static_cast<double>(counted.sum().item<int64_t>());
    if (n == 0) return;
    totals.loss_sum += Compute(output, target).item<double>() * n;
    totals.counted += n;
    totals.correct += static_cast<double>(
        scores.argmax(1).eq(classes.to(at::kLong)).logical_and(counted).sum().item<int64_t>());
  }

  Evaluation Result(const Totals& t) const override {
    Evaluation e;
    const double loss = t.counted > 0 ? t.loss_sum / t.counted : 0;
    e.accuracy = t.counted > 0 ? t.correct / t.counted : 0;
    e.metrics["test_loss"] = loss;
    e.summary = absl::StrCat("test accuracy ", *e.accuracy, " (", t.correct, " of ", t.counted, "), test loss ", loss);
    return e;
  }

 private:
  int64_t ignore_index_;
};

// mse, l1, smooth_l1 and bce_with_logits: elementwise, on same-shaped float tensors.
class Elementwise final : public LossFunction {
 public:
  enum class Kind { kMse, kL1, kSmoothL1, kBce };
  explicit Elementwise(Kind kind) : kind_(kind) {}

  at::Tensor Compute(const at::Tensor& output, const at::Tensor& target) const override {
    at::Tensor out = output;
    if (out.dim() == target.dim() + 1 && out.size(-1) == 1) out = out.squeeze(-1);
    TORCH_CHECK(out.sizes() == target.sizes(), Name(), " compares an output and a target of one shape; got ",
                Shape(output), " against ", Shape(target));
    const at::Tensor o = out.to(at::kFloat);
    const at::Tensor y = target.to(at::kFloat);
    switch (kind_) {
      case Kind::kMse: return F::mse_loss(o, y);
      case Kind::kL1: return F::l1_loss(o, y);
      case Kind::kSmoothL1: return F::smooth_l1_loss(o, y);
      case Kind::kBce: return F::binary_cross_entropy_with_logits(o, y);
    }
    return {};
  }

  void Add(const at::Tensor& output, const at::Tensor& target, Totals& totals) const override {
    const double n = static_cast<double>(target.numel());
    if (n == 0) return;
    totals.loss_sum += Compute(output, target).item<double>() * n;
    totals.counted += n;
    if (kind_ == Kind::kBce) {
      const at::Tensor out = output.dim() == target.dim() + 1 ? output.squeeze(-1) : output;
      totals.correct += static_cast<double>(out.gt(0).eq(target.gt(0.5)).sum().item<int64_t>());
    }
  }

  Evaluation Result(const Totals& t) const override {
    Evaluation e;
    const double loss = t.counted > 0 ? t.loss_sum / t.counted : 0;
    e.metrics["test_loss"] = loss;
    std::string summary = absl::StrCat("test loss ", loss, " (", Name(), ")");
    if (kind_ == Kind::kMse) e.metrics["test_mse"] = loss;
    if (kind_ == Kind::kL1) e.metrics["test_mae"] = loss;
    if (kind_ == Kind::kBce) {
      e.accuracy = t.counted > 0 ? t.correct / t.counted : 0;
      absl::StrAppend(&summary, ", accuracy ", *e.accuracy);
    }
    e.summary = absl::StrCat(summary, " over ", t.counted, " values");
    return e;
  }

 private:
  const char* Name() const {
    switch (kind_) {
      case Kind::kMse: return "mse";
      case Kind::kL1: return "l1";
      case Kind::kSmoothL1: return "smooth_l1";
      case Kind::kBce: return "bce_with_logits";
    }
    return "";
  }
  Kind kind_;
};

class ModuleLoss final : public LossFunction {
 public:
  explicit ModuleLoss(ModuleLossMethod method) : method_(std::move(method)) {}

  at::Tensor Compute(const at::Tensor& output, const at::Tensor& target) const override {
    at::Tensor loss = method_(output, target);
    TORCH_CHECK(loss.numel() == 1 && loss.is_floating_point(),
                "the module's compute_loss must return a floating-point scalar; it returned ",
                c10::toString(loss.scalar_type()), " ", Shape(loss));
    return loss.reshape({});
  }

  void Add(const at::Tensor& output, const at::Tensor& target, Totals& totals) const override {
    const double n = static_cast<double>(target.size(0));
    totals.loss_sum += Compute(output, target).item<double>() * n;
    totals.counted += n;
  }

  Evaluation Result(const Totals& t) const override {
    Evaluation e;
    const double loss = t.counted > 0 ? t.loss_sum / t.counted : 0;
    e.metrics["test_loss"] = loss;
    e.summary = absl::StrCat("test loss ", loss, " (the module's compute_loss) over ", t.counted, " samples");
    return e;
  }

 private:
  ModuleLossMethod method_;
};

}  // namespace

std::string LossName(fitrun::v1::LossKind kind) {
  switch (kind) {
    case fitrun::v1::LOSS_KIND_UNSPECIFIED:
    case fitrun::v1::LOSS_KIND_CROSS_ENTROPY: return "cross_entropy";
    case fitrun::v1::LOSS_KIND_MSE: return "mse";
    case fitrun::v1::LOSS_KIND_L1: return "l1";
    case fitrun::v1::LOSS_KIND_BCE_WITH_LOGITS: return "bce_with_logits";
    case fitrun::v1::LOSS_KIND_SMOOTH_L1: return "smooth_l1";
    case fitrun::v1::LOSS_KIND_MODULE: return "module";
    default: return absl::StrCat("loss kind ", static_cast<int>(kind));
  }
}

absl::StatusOr<std::unique_ptr<LossFunction>> MakeLoss(const fitrun::v1::LossSpec& spec, ModuleLossMethod module_loss) {
  switch (spec.kind()) {
    case fitrun::v1::LOSS_KIND_UNSPECIFIED:
    case fitrun::v1::LOSS_KIND_CROSS_ENTROPY:
      // PyTorch's default ignore_index: no class is -100.
      return std::make_unique<CrossEntropy>(spec.has_ignore_index() ? spec.ignore_index() : -100);
    case fitrun::v1::LOSS_KIND_MSE: return std::make_unique<Elementwise>(Elementwise::Kind::kMse);
    case fitrun::v1::LOSS_KIND_L1: return std::make_unique<Elementwise>(Elementwise::Kind::kL1);
    case fitrun::v1::LOSS_KIND_SMOOTH_L1: return std::make_unique<Elementwise>(Elementwise::Kind::kSmoothL1);
    case fitrun::v1::LOSS_KIND_BCE_WITH_LOGITS: return std::make_unique<Elementwise>(Elementwise::Kind::kBce);
    case fitrun::v1::LOSS_KIND_MODULE:
      if (!module_loss) {
        return absl::InvalidArgumentError("spec.loss: module needs a TorchScript model with a compute_loss method");
      }
      return std::make_unique<ModuleLoss>(std::move(module_loss));
    default:
      return absl::InvalidArgumentError(absl::StrCat("spec.loss.kind: unknown (", static_cast<int>(spec.kind()), ")"));
  }
}

}  // namespace fitrun::worker
