#include "worker/models/torchscript_model.h"

#include <ATen/ATen.h>
#include <torch/script.h>
#include <torch/utils.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/models/losses.h"

namespace fitrun::worker {
namespace {

// nn::Module names cannot contain '.', which TorchScript uses to join submodule names.
std::string LocalName(std::string name) {
  std::replace(name.begin(), name.end(), '.', '/');
  return name;
}

std::string Describe(const at::Tensor& t) {
  return absl::StrCat(c10::toString(t.scalar_type()), " [", absl::StrJoin(t.sizes(), ", "), "]");
}

class TorchScriptModel final : public Model {
 public:
  explicit TorchScriptModel(torch::jit::Module module) : Model("TorchScript"), module_(std::move(module)) {
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      register_parameter(LocalName(p.name), p.value, p.value.requires_grad());
    }
    // Integer buffers (BatchNorm's num_batches_tracked) advance identically on every rank and cannot
    // go through the float32 broadcast; floating ones (running statistics) are shared with it.
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      if (b.value.is_floating_point()) register_buffer(LocalName(b.name), b.value);
    }
  }

  torch::jit::Module& module() { return module_; }
  void set_loss(std::unique_ptr<LossFunction> loss) { loss_ = std::move(loss); }

  at::Tensor Forward(const ModelInputs& inputs) override {
    return module_.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())).toTensor();
  }

  at::Tensor Loss(const ModelInputs& inputs, const at::Tensor& targets) override {
    return loss_->Compute(Forward(inputs), targets);
  }

  absl::StatusOr<Evaluation> Evaluate(const TensorDataset& test, int64_t batch) override {
    LossFunction::Totals totals;
    absl::Status evaluated = ForEachTestBatch(
        test, batch, [&](const TensorDataset& rows) { loss_->Add(Forward(rows.inputs), rows.targets, totals); });
    if (!evaluated.ok()) return evaluated;
    return loss_->Result(totals);
  }

  void train(bool on = true) override {
    Model::train(on);
    module_.train(on);
  }

 private:
  torch::jit::Module module_;
  std::unique_ptr<LossFunction> loss_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Model>> LoadTorchScriptModel(const std::string& path, const fitrun::v1::LossSpec& loss,
                                                            const TensorDataset& sample, uint64_t seed) {
  const std::string field = absl::StrCat("spec.model.torchscript: '", path, "'");
  torch::manual_seed(seed);
  std::shared_ptr<TorchScriptModel> model;
  try {
    model = std::make_shared<TorchScriptModel>(torch::jit::load(path));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is not a loadable TorchScript file: ", e.what()));
  }
  for (const auto& p : model->named_parameters()) {
    if (p.value().scalar_type() != at::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": parameter ", p.key(), " is ",
                                                     c10::toString(p.value().scalar_type()),
                                                     "; only float32 parameters are supported"));
    }
  }
  if (model->parameters().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has no parameters to train"));
  }
  ModuleLossMethod module_loss;
  if (loss.kind() == fitrun::v1::LOSS_KIND_MODULE) {
    if (!model->module().find_method("compute_loss").has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.loss: module, but ", path, " has no compute_loss(output, target) method (export it with "
          "@torch.jit.export, or name a loss such as cross_entropy)"));
    }
    module_loss = [m = &model->module()](const at::Tensor& output, const at::Tensor& target) {
      return m->run_method("compute_loss", output, target).toTensor();
    };
  }
  absl::StatusOr<std::unique_ptr<LossFunction>> loss_function = MakeLoss(loss, std::move(module_loss));
  if (!loss_function.ok()) return loss_function.status();
  model->set_loss(*std::move(loss_function));

  std::vector<std::string> shapes;
  for (const at::Tensor& input : sample.inputs) shapes.push_back(Describe(input));
  const std::string inputs = absl::StrJoin(shapes, ", ");
  at::Tensor output;
  try {
    at::NoGradGuard no_grad;
    model->eval();
    output = model->Forward(sample.inputs);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": forward must accept the dataset's inputs (", inputs, " for two samples) but failed: ", e.what()));
  }
  try {
    at::NoGradGuard no_grad;
    (void)model->Loss(sample.inputs, sample.targets);
    model->train();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec.loss: ", LossName(loss.kind()), " cannot compare the model's output (",
                                                   Describe(output), " for inputs ", inputs, ") with the target (",
                                                   Describe(sample.targets), "): ", e.what()));
  }
  return std::shared_ptr<Model>(std::move(model));
}

}  // namespace fitrun::worker
