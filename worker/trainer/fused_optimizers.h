#ifndef FITRUN_WORKER_TRAINER_FUSED_OPTIMIZERS_H_
#define FITRUN_WORKER_TRAINER_FUSED_OPTIMIZERS_H_

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace fitrun::worker {

// torch::optim's SGD, Adam and AdamW, each step one fused kernel over all of a group's parameters
// (LibTorch 2.x's at::_fused_sgd_, _fused_adam_, _fused_adamw_, through worker/torch_compat.h) where
// torch::optim launches several kernels per parameter: on a GPU, for a model of many small tensors,
// those launches are most of an optimizer step. LibTorch's C++ optimizers have no `fused` option, so
// these subclasses replace step() and nothing else: the state (momentum buffers; step counts and
// moments) lives where and as torch::optim keeps it, so checkpoints, sharded states and loading see
// the optimizer they know. The numbers are torch::optim's up to rounding (fused_optimizers_test).
// Options these kernels do not cover (SGD's dampening and Nesterov momentum, Adam's amsgrad) step as
// torch::optim does. Only where torch_compat::HasFusedOptimizerKernels(); owned by the training thread.
class FusedSgd final : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdam final : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdamW final : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_FUSED_OPTIMIZERS_H_
