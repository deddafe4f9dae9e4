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

namespace fitrun::worker {
namespace {

constexpr int64_t kClasses = 10;

// nn::Module names cannot contain '.', which TorchScript uses to join submodule names.
std::string LocalName(std::string name) {
  std::replace(name.begin(), name.end(), '.', '/');
  return name;
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

  at::Tensor Forward(const ModelInputs& inputs) override {
    return module_.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())).toTensor();
  }

  void train(bool on = true) override {
    Model::train(on);
    module_.train(on);
  }

 private:
  torch::jit::Module module_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Model>> LoadTorchScriptModel(const std::string& path, uint64_t seed) {
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
  at::Tensor logits;
  try {
    at::NoGradGuard no_grad;
    model->eval();
    logits = model->Forward({at::zeros({2, 1, 28, 28})});
    model->train();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": forward must accept images [B, 1, 28, 28] float32 but failed on [2, 1, 28, 28]: ", e.what()));
  }
  if (logits.dim() != 2 || logits.size(0) != 2 || logits.size(1) < kClasses ||
      logits.scalar_type() != at::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": forward must return float32 logits [B, classes >= 10]; for [2, 1, 28, 28] it returned ",
        c10::toString(logits.scalar_type()), " [", absl::StrJoin(logits.sizes(), ", "), "]"));
  }
  return std::shared_ptr<Model>(std::move(model));
}

}  // namespace fitrun::worker
