#include "worker/models/model.h"

#include <torch/nn/init.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace fitrun::worker {
namespace {

fitrun::v1::ModelSpec Builtin(const std::string& name) {
  fitrun::v1::ModelSpec spec;
  spec.set_builtin(name);
  return spec;
}

int64_t ParameterCount(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters()) n += p.numel();
  return n;
}

TEST(ModelTest, MlpHasTheExampleShape) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(Builtin("mlp"), 1);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(ParameterCount(**model), 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
  EXPECT_EQ((*model)->Forward({torch::zeros({3, 1, 28, 28})}).sizes(), (at::IntArrayRef{3, 10}));
}

TEST(ModelTest, CnnHasTheExampleShape) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(Builtin("cnn"), 1);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(ParameterCount(**model),
            32 * 9 + 32 + 64 * 32 * 9 + 64 + 9216 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ((*model)->Forward({torch::zeros({2, 1, 28, 28})}).sizes(), (at::IntArrayRef{2, 10}));
}

// The cnn runs channels-last and pools before its second ReLU; the loss and every gradient must be
// those of PyTorch's example as written (NCHW, ReLU then pooling), up to the kernels' summation order.
TEST(ModelTest, CnnComputesWhatTheExampleComputes) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(Builtin("cnn"), 3);
  ASSERT_TRUE(model.ok()) << model.status();
  torch::manual_seed(11);
  const at::Tensor images = torch::randn({16, 1, 28, 28});
  const at::Tensor targets = torch::randint(0, 10, {16}, torch::kLong);
  std::map<std::string, at::Tensor> p;
  for (const auto& item : (*model)->named_parameters()) p[item.key()] = item.value();

  at::Tensor x = torch::relu(torch::conv2d(images, p["conv1.weight"], p["conv1.bias"]));
  x = torch::max_pool2d(torch::relu(torch::conv2d(x, p["conv2.weight"], p["conv2.bias"])), {2, 2});
  x = torch::relu(torch::linear(x.flatten(1), p["fc1.weight"], p["fc1.bias"]));
  const at::Tensor expected_loss =
      torch::nn::functional::cross_entropy(torch::linear(x, p["fc2.weight"], p["fc2.bias"]), targets);
  const std::vector<at::Tensor> expected = torch::autograd::grad({expected_loss}, (*model)->parameters());

  const at::Tensor loss = (*model)->Loss({images}, targets);
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), expected_loss.item<double>(), 1e-6);
  const std::vector<at::Tensor> parameters = (*model)->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(parameters[i].is_contiguous()) << "parameter " << i << " keeps PyTorch's layout";
    EXPECT_TRUE(parameters[i].grad().is_contiguous()) << "gradient " << i;
    EXPECT_TRUE(torch::allclose(parameters[i].grad(), expected[i], 1e-4, 1e-6))
        << "gradient " << i << " differs by " << (parameters[i].grad() - expected[i]).abs().max().item<double>();
  }
}

TEST(ModelTest, SameSeedSameWeights) {
  for (const char* name : {"mlp", "cnn"}) {
    auto a = CreateModel(Builtin(name), 7);
    auto b = CreateModel(Builtin(name), 7);
    auto c = CreateModel(Builtin(name), 8);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(ParameterChecksum(**a), ParameterChecksum(**b)) << name;
    EXPECT_NE(ParameterChecksum(**a), ParameterChecksum(**c)) << name;
  }
}

TEST(ModelTest, UnknownModelNamesTheField) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(Builtin("resnet"), 1);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(model.status().message(), "spec.model.builtin"));
  EXPECT_FALSE(CreateModel(fitrun::v1::ModelSpec(), 1).ok());
}

// A module with one known parameter pins the checksum's definition (FNV-1a over raw float bytes).
struct OneParameter : torch::nn::Module {
  OneParameter() { register_parameter("w", torch::tensor({1.0f, -2.0f})); }
};

TEST(ModelTest, ChecksumIsFnv1aOverRawFloatBytes) {
  OneParameter module;
  uint64_t hash = 0xcbf29ce484222325ULL;
  const float values[] = {1.0f, -2.0f};
  const auto* bytes = reinterpret_cast<const uint8_t*>(values);
  for (size_t i = 0; i < sizeof(values); ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  EXPECT_EQ(ParameterChecksum(module), hex);
  EXPECT_EQ(ParameterChecksum(module).size(), 16u);
}

}  // namespace
}  // namespace fitrun::worker
