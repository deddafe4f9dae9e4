#include "worker/trainer/fused_optimizers.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "worker/torch_compat.h"

namespace fitrun::worker {
namespace {

// The parameters of one fused call and their tensors, in the same order.
struct AdamBatch {
  std::vector<at::Tensor> parameters, gradients, exp_avgs, exp_avg_sqs;
};

// Adam's and AdamW's step, as torch::optim's, with the kernels fused: each parameter's state is made
// as torch::optim makes it, its step counted on the host, and the parameters at the same step (all
// of them, but after a partial load) go through one kernel.
template <typename StateT, typename OptionsT, typename StateMap>
void FusedAdamFamilyStep(std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& state,
                         bool decoupled_weight_decay) {
  at::NoGradGuard no_grad;
  for (torch::optim::OptimizerParamGroup& group : groups) {
    const auto& options = static_cast<const OptionsT&>(group.options());
    std::map<int64_t, AdamBatch> by_step;
    for (at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state[torch_compat::OptimizerStateKey(p)];
      if (slot == nullptr) {
        auto fresh = std::make_unique<StateT>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& s = static_cast<StateT&>(*slot);
      s.step(s.step() + 1);
      AdamBatch& batch = by_step[s.step()];
      batch.parameters.push_back(p);
      batch.gradients.push_back(p.grad());
      batch.exp_avgs.push_back(s.exp_avg());
      batch.exp_avg_sqs.push_back(s.exp_avg_sq());
    }
    for (auto& [step, batch] : by_step) {
      torch_compat::FusedAdamStep(batch.parameters, batch.gradients, batch.exp_avgs, batch.exp_avg_sqs, step,
                                  options.lr(), std::get<0>(options.betas()), std::get<1>(options.betas()),
                                  options.eps(), options.weight_decay(), decoupled_weight_decay);
    }
  }
}

}  // namespace

torch::Tensor FusedSgd::step(LossClosure closure) {
  for (const torch::optim::OptimizerParamGroup& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    if (options.dampening() != 0 || options.nesterov()) return SGD::step(std::move(closure));
  }
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  for (torch::optim::OptimizerParamGroup& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    // Parameters with a momentum buffer already, and those whose buffer this step starts (the kernel
    // sets a first step's buffer to the gradient, as torch::optim's clone does).
    std::vector<at::Tensor> parameters[2], gradients[2], buffers[2];
    for (at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      int first = 0;
      if (options.momentum() != 0) {
        auto& slot = state_[torch_compat::OptimizerStateKey(p)];
        if (slot == nullptr) {
          auto fresh = std::make_unique<torch::optim::SGDParamState>();
          fresh->momentum_buffer(at::empty_like(p, at::MemoryFormat::Preserve));
          slot = std::move(fresh);
          first = 1;
        }
        buffers[first].push_back(static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
      }
      parameters[first].push_back(p);
      gradients[first].push_back(p.grad());
    }
    for (int first = 0; first < 2; ++first) {
      if (parameters[first].empty()) continue;
      torch_compat::FusedSgdStep(parameters[first], gradients[first], buffers[first], options.lr(),
                                 options.momentum(), options.weight_decay(), first == 1);
    }
  }
  return loss;
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  for (const torch::optim::OptimizerParamGroup& group : param_groups_) {
    if (static_cast<const torch::optim::AdamOptions&>(group.options()).amsgrad()) return Adam::step(std::move(closure));
  }
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  FusedAdamFamilyStep<torch::optim::AdamParamState, torch::optim::AdamOptions>(param_groups_, state_,
                                                                               /*decoupled_weight_decay=*/false);
  return loss;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  for (const torch::optim::OptimizerParamGroup& group : param_groups_) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) {
      return AdamW::step(std::move(closure));
    }
  }
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  FusedAdamFamilyStep<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(param_groups_, state_,
                                                                                 /*decoupled_weight_decay=*/true);
  return loss;
}

}  // namespace fitrun::worker
