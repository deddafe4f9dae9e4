// The tensor ops of worker/torch_compat.h: what LibTorch 2.x computes in one kernel and 1.13 cannot.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "worker/torch_compat.h"

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#endif

namespace fitrun::worker::torch_compat {

bool HasFusedOptimizerKernels() { return TORCH_VERSION_MAJOR >= 2; }

void FusedSgdStep(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& gradients,
                  const std::vector<at::Tensor>& momentum_buffers, double lr, double momentum, double weight_decay,
                  bool first_step) {
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_sgd_(parameters, gradients, momentum_buffers, weight_decay, momentum, lr, /*dampening=*/0.0,
                  /*nesterov=*/false, /*maximize=*/false, first_step);
#else
  (void)parameters, (void)gradients, (void)momentum_buffers, (void)lr, (void)momentum, (void)weight_decay,
      (void)first_step;
  TORCH_CHECK(false, "this LibTorch (", TORCH_VERSION, ") has no fused SGD kernel");
#endif
}

void FusedAdamStep(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& gradients,
                   const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs, int64_t step,
                   double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled_weight_decay) {
#if TORCH_VERSION_MAJOR >= 2
  if (parameters.empty()) return;
  // The kernels read each parameter's step from a tensor on its device (torch.optim keeps one per
  // parameter there); every parameter here is at the same step, so one tensor serves them all.
  const at::Tensor step_tensor = at::full({}, static_cast<double>(step), parameters.front().options().dtype(at::kFloat));
  const std::vector<at::Tensor> steps(parameters.size(), step_tensor);
  if (decoupled_weight_decay) {
    at::_fused_adamw_(parameters, gradients, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(parameters, gradients, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                     weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
  }
#else
  (void)parameters, (void)gradients, (void)exp_avgs, (void)exp_avg_sqs, (void)step, (void)lr, (void)beta1,
      (void)beta2, (void)eps, (void)weight_decay, (void)decoupled_weight_decay;
  TORCH_CHECK(false, "this LibTorch (", TORCH_VERSION, ") has no fused Adam kernel");
#endif
}

at::Tensor ScaledDotProductCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t time = q.size(-2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  // Built per call rather than kept as a buffer: a bool buffer would be broadcast and checksummed
  // with the parameters, and it is cheap next to the matmuls.
  const at::Tensor future = at::ones({time, time}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v);
#endif
}

}  // namespace fitrun::worker::torch_compat
