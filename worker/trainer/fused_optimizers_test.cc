#include "worker/trainer/fused_optimizers.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/torch_compat.h"

namespace fitrun::worker {
namespace {

// Parameters of a few shapes, the same values for every optimizer compared.
std::vector<at::Tensor> Parameters() {
  at::manual_seed(21);
  return {at::randn({7, 5}).requires_grad_(), at::randn({5}).requires_grad_(), at::randn({3, 2, 4}).requires_grad_()};
}

using MakeFn = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// Steps a plain and a fused optimizer through the same gradients; their parameters stay together.
void ExpectSameSteps(const MakeFn& plain_of, const MakeFn& fused_of) {
  if (!torch_compat::HasFusedOptimizerKernels()) GTEST_SKIP() << "this LibTorch has no fused optimizer kernels";
  std::vector<at::Tensor> plain_parameters = Parameters();
  std::vector<at::Tensor> fused_parameters = Parameters();
  std::unique_ptr<torch::optim::Optimizer> plain = plain_of(plain_parameters);
  std::unique_ptr<torch::optim::Optimizer> fused = fused_of(fused_parameters);
  at::manual_seed(5);
  for (int step = 0; step < 6; ++step) {
    for (size_t i = 0; i < plain_parameters.size(); ++i) {
      const at::Tensor gradient = at::randn(plain_parameters[i].sizes());
      plain_parameters[i].mutable_grad() = gradient.clone();
      fused_parameters[i].mutable_grad() = gradient.clone();
    }
    plain->step();
    fused->step();
    for (size_t i = 0; i < plain_parameters.size(); ++i) {
      EXPECT_TRUE(at::allclose(fused_parameters[i], plain_parameters[i], 1e-5, 1e-6))
          << "step " << step << " parameter " << i << ": "
          << (fused_parameters[i] - plain_parameters[i]).abs().max().item<double>();
    }
  }
  // The state is torch::optim's, an entry for each parameter torch::optim keeps one for (plain SGD
  // keeps none), for checkpoints to save and load.
  EXPECT_EQ(fused->state().size(), plain->state().size());
  for (size_t i = 0; i < plain_parameters.size(); ++i) {
    EXPECT_EQ(fused->state().count(torch_compat::OptimizerStateKey(fused_parameters[i])),
              plain->state().count(torch_compat::OptimizerStateKey(plain_parameters[i])))
        << "parameter " << i;
  }
}

TEST(FusedOptimizersTest, SgdWithMomentumAndWeightDecayStepsAsTorchOptim) {
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01);
  ExpectSameSteps([&](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, options); },
                  [&](std::vector<at::Tensor> p) { return std::make_unique<FusedSgd>(p, options); });
}

TEST(FusedOptimizersTest, PlainSgdStepsAsTorchOptim) {
  const auto options = torch::optim::SGDOptions(0.1);
  ExpectSameSteps([&](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, options); },
                  [&](std::vector<at::Tensor> p) { return std::make_unique<FusedSgd>(p, options); });
}

TEST(FusedOptimizersTest, AdamStepsAsTorchOptim) {
  const auto options = torch::optim::AdamOptions(1e-2).weight_decay(0.01);
  ExpectSameSteps([&](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::Adam>(p, options); },
                  [&](std::vector<at::Tensor> p) { return std::make_unique<FusedAdam>(p, options); });
}

TEST(FusedOptimizersTest, AdamWStepsAsTorchOptim) {
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  ExpectSameSteps([&](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::AdamW>(p, options); },
                  [&](std::vector<at::Tensor> p) { return std::make_unique<FusedAdamW>(p, options); });
}

// A fused optimizer is still the kind its checkpoints are written and read as.
TEST(FusedOptimizersTest, AreTheirTorchOptimKinds) {
  std::vector<at::Tensor> parameters = Parameters();
  FusedAdamW adamw(parameters, torch::optim::AdamWOptions(1e-3));
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(static_cast<torch::optim::Optimizer*>(&adamw)), nullptr);
  FusedSgd sgd(parameters, torch::optim::SGDOptions(1e-3));
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(static_cast<torch::optim::Optimizer*>(&sgd)), nullptr);
}

}  // namespace
}  // namespace fitrun::worker
