#include "worker/trainer/grad_scaler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fitrun::worker {

absl::StatusOr<std::unique_ptr<GradScaler>> GradScaler::Create(const Options& options) {
  if (!(options.init_scale > 0) || !std::isfinite(options.init_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("grad scaler: init_scale must be > 0 (got ",
                                                   options.init_scale, ")"));
  }
  if (!(options.growth_factor > 1) || !std::isfinite(options.growth_factor)) {
    return absl::InvalidArgumentError(absl::StrCat("grad scaler: growth_factor must be > 1 (got ",
                                                   options.growth_factor, ")"));
  }
  if (!(options.backoff_factor > 0 && options.backoff_factor < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("grad scaler: backoff_factor must be in (0, 1) (got ",
                                                   options.backoff_factor, ")"));
  }
  if (options.growth_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat("grad scaler: growth_interval must be >= 1 (got ",
                                                   options.growth_interval, ")"));
  }
  return std::unique_ptr<GradScaler>(new GradScaler(options));
}

at::Tensor GradScaler::Scale(const at::Tensor& loss) const { return loss * scale_; }

bool GradScaler::Unscale(const std::vector<at::Tensor>& parameters) const {
  at::NoGradGuard no_grad;
  // As torch.cuda.amp: multiply by the reciprocal computed in double, then rounded to float32.
  const double inverse = 1.0 / scale_;
  at::Tensor found_inf;
  for (const at::Tensor& p : parameters) {
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    // The values backward produced are checked, before unscaling, as PyTorch's kernel does.
    at::Tensor bad = at::logical_not(at::isfinite(grad)).any();
    found_inf = found_inf.defined() ? at::logical_or(found_inf, bad) : bad;
    grad.mul_(inverse);
  }
  return !found_inf.defined() || !found_inf.item<bool>();
}

void GradScaler::Update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_steps_;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    // PyTorch keeps the old scale when growing would overflow float32.
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
    growth_tracker_ = 0;
  }
}

}  // namespace fitrun::worker
