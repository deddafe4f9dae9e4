#include "worker/models/model.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/model_shapes.h"

namespace fitrun::worker {
namespace {

namespace F = torch::nn::functional;

namespace shapes = fitrun::contract::models;

// PyTorch's MNIST MLP: 784-512-512-10 with ReLU (proto/contract/model_shapes.h).
class Mlp final : public Model {
 public:
  Mlp()
      : Model("Mlp"),
        fc1_(register_module("fc1", torch::nn::Linear(shapes::kImagePixels, shapes::kMlpHidden))),
        fc2_(register_module("fc2", torch::nn::Linear(shapes::kMlpHidden, shapes::kMlpHidden))),
        fc3_(register_module("fc3", torch::nn::Linear(shapes::kMlpHidden, shapes::kClasses))) {}

  at::Tensor Forward(const ModelInputs& inputs) override {
    at::Tensor x = inputs.at(0).flatten(1);
    x = F::relu(fc1_->forward(x));
    x = F::relu(fc2_->forward(x));
    return fc3_->forward(x);
  }

 private:
  torch::nn::Linear fc1_;
  torch::nn::Linear fc2_;
  torch::nn::Linear fc3_;
};

// PyTorch's examples/mnist CNN without its dropout layers, whose random masks would make runs with
// the same seed differ by thread timing.
class Cnn final : public Model {
 public:
  Cnn()
      : Model("Cnn"),
        conv1_(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, shapes::kCnnConv1Channels,
                                                                                      shapes::kCnnKernel)))),
        conv2_(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(shapes::kCnnConv1Channels,
                                                                                      shapes::kCnnConv2Channels,
                                                                                      shapes::kCnnKernel)))),
        fc1_(register_module("fc1", torch::nn::Linear(shapes::kCnnFlattened, shapes::kCnnHidden))),
        fc2_(register_module("fc2", torch::nn::Linear(shapes::kCnnHidden, shapes::kClasses))) {}

  at::Tensor Forward(const ModelInputs& inputs) override {
    at::Tensor x = inputs.at(0);
    if (x.is_cpu() && x.dim() == 4) {
      // oneDNN's convolutions, and the pooling and ReLUs between them, run fastest channels-last
      // (about 1.3x a training step on this model). The layout is set by strides: a one-channel
      // image counts as contiguous either way, so contiguous(ChannelsLast) would keep it NCHW. The
      // parameters keep PyTorch's layout, so the buckets, checkpoints and optimizers see no change.
      x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::ChannelsLast)).copy_(x);
    }
    x = F::relu(conv1_->forward(x));
    // Pooling before the ReLU computes exactly the same values and gradients (ReLU is monotonic, and
    // a window whose maximum is <= 0 passes no gradient either way), on a quarter of the elements.
    x = F::relu(F::max_pool2d(conv2_->forward(x), F::MaxPool2dFuncOptions(shapes::kCnnPool)));
    // flatten copies a channels-last map into PyTorch's (C, H, W) order, the one fc1's weights expect.
    x = F::relu(fc1_->forward(x.flatten(1)));
    return fc2_->forward(x);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::Conv2d conv2_;
  torch::nn::Linear fc1_;
  torch::nn::Linear fc2_;
};

}  // namespace

at::Tensor Model::Loss(const ModelInputs& inputs, const at::Tensor& targets) {
  return F::cross_entropy(Forward(inputs), targets);
}

absl::Status Model::ForEachTestBatch(const TensorDataset& test, int64_t batch,
                                     const std::function<void(const TensorDataset& rows)>& visit) {
  if (test.size() == 0) return absl::InvalidArgumentError("empty evaluation set");
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("eval batch must be >= 1 (got ", batch, ")"));
  const bool was_training = is_training();
  try {
    at::NoGradGuard no_grad;
    eval();
    for (int64_t begin = 0; begin < test.size(); begin += batch) {
      visit(test.Slice(begin, std::min(batch, test.size() - begin)));
    }
    train(was_training);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    train(was_training);
    return absl::InternalError(absl::StrCat("evaluation failed: ", e.what()));
  }
}

absl::StatusOr<Evaluation> Model::Evaluate(const TensorDataset& test, int64_t batch) {
  int64_t correct = 0;
  absl::Status evaluated = ForEachTestBatch(test, batch, [&](const TensorDataset& rows) {
    correct += Forward(rows.inputs).argmax(1).eq(rows.targets).sum().item<int64_t>();
  });
  if (!evaluated.ok()) return evaluated;
  Evaluation evaluation;
  evaluation.accuracy = static_cast<double>(correct) / test.size();
  evaluation.summary = absl::StrCat("test accuracy ", *evaluation.accuracy, " (", correct, " of ", test.size(), ")");
  return evaluation;
}

absl::StatusOr<std::shared_ptr<Model>> CreateModel(const fitrun::v1::ModelSpec& spec, uint64_t seed) {
  if (spec.kind_case() != fitrun::v1::ModelSpec::kBuiltin) {
    return absl::InvalidArgumentError("spec.model.builtin: required for an image classifier (mlp or cnn)");
  }
  torch::manual_seed(seed);
  if (spec.builtin() == "mlp") return std::make_shared<Mlp>();
  if (spec.builtin() == "cnn") return std::make_shared<Cnn>();
  return absl::InvalidArgumentError(absl::StrCat("spec.model.builtin: \"", spec.builtin(),
                                                 "\" is not an image classifier (mlp, cnn); the others are built "
                                                 "with their data by LoadWorkload"));
}

std::string ParameterChecksum(const torch::nn::Module& module) {
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a 64-bit offset basis
  for (const at::Tensor& parameter : module.parameters()) {
    const at::Tensor bytes = parameter.detach().to(at::kCPU).contiguous();
    const auto* data = static_cast<const uint8_t*>(bytes.data_ptr());
    const size_t size = bytes.numel() * bytes.element_size();
    for (size_t i = 0; i < size; ++i) {
      hash ^= data[i];
      hash *= 0x100000001b3ULL;  // FNV prime
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace fitrun::worker
