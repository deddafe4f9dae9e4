#include "worker/trainer/loss_readback.h"

#include <ATen/ATen.h>

#include <cmath>

namespace fitrun::worker {

void LossReadback::Add(int64_t step, const at::Tensor& loss) {
  steps_.push_back(step);
  // float64 as the host would read it (a float32 loss widens exactly), so the losses of one device
  // join in one tensor whatever the synchronizer returned.
  losses_.push_back(loss.detach().reshape({1}).to(at::kDouble));
}

void LossReadback::ReadAll() {
  if (losses_.empty()) return;
  const at::Tensor host = at::cat(losses_).to(at::kCPU).contiguous();
  const double* values = host.data_ptr<double>();
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (!first_non_finite_.has_value() && !std::isfinite(values[i])) first_non_finite_ = NonFinite{steps_[i], values[i]};
  }
  last_step_ = steps_.back();
  last_loss_ = values[steps_.size() - 1];
  steps_.clear();
  losses_.clear();
}

bool LossCheckDue(int64_t step, int64_t total_steps, int64_t interval_steps, int64_t checkpoint_every_steps) {
  if (step >= total_steps) return true;
  if (interval_steps <= 1 || step % interval_steps == 0) return true;
  return checkpoint_every_steps > 0 && step % checkpoint_every_steps == 0;
}

}  // namespace fitrun::worker
