#ifndef FITRUN_WORKER_TRAINER_GRAD_SCALER_H_
#define FITRUN_WORKER_TRAINER_GRAD_SCALER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace fitrun::worker {

// Dynamic loss scaling for fp16 mixed precision, as torch.cuda.amp.GradScaler does it: the loss is
// multiplied by `scale` before backward so that small fp16 activation gradients do not flush to zero;
// before the optimizer step the gradients are divided by it again and checked. A step whose gradients
// hold an inf or a NaN is skipped and the scale halves; after growth_interval good steps in a row it
// doubles.
//
// Written with plain tensor ops (LibTorch 1.13 has _amp_foreach_non_finite_check_and_unscale_ and
// _amp_update_scale_ for CUDA only), so the same code runs, and is tested, on CPU tensors. The scale is
// a host double: the only device->host sync per step is the one found-inf flag.
//
// Across ranks: Unscale is called after the GradientSynchronizer has replaced every gradient with its
// mean over ranks. The all-reduce leaves bitwise-identical buckets on every rank, and an inf or NaN on
// any rank makes the sum (so the mean) non-finite on all of them, so every rank reaches the same
// found-inf verdict and skips or takes the same steps without a collective of its own (the all-reduce
// of the gradients is the all-reduce of the flag). grad_scaler_test checks this with two ranks.
//
// Thread-safety: owned by the training thread.
class GradScaler {
 public:
  // torch.cuda.amp.GradScaler's defaults.
  struct Options {
    double init_scale = 65536.0;  // 2^16
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };

  // InvalidArgument for a scale <= 0, growth <= 1, backoff outside (0, 1) or an interval < 1.
  static absl::StatusOr<std::unique_ptr<GradScaler>> Create(const Options& options);

  // loss * scale, for backward.
  at::Tensor Scale(const at::Tensor& loss) const;

  // Divides every defined gradient of `parameters` by the scale in place and returns whether they are
  // all finite. Call once per optimizer step, after the gradients are synchronized.
  bool Unscale(const std::vector<at::Tensor>& parameters) const;

  // Adjusts the scale after a step: backs off when `found_inf`, grows after growth_interval finite
  // steps in a row.
  void Update(bool found_inf);

  // Unscale; the optimizer step (`step`) only when every gradient is finite; Update. Returns whether
  // the step was taken.
  template <typename StepFn>
  bool UnscaleStepAndUpdate(const std::vector<at::Tensor>& parameters, StepFn&& step) {
    const bool finite = Unscale(parameters);
    if (finite) step();
    Update(!finite);
    return finite;
  }

  double scale() const { return scale_; }
  // Finite steps since the last growth or back-off.
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t skipped_steps() const { return skipped_steps_; }

 private:
  explicit GradScaler(const Options& options) : options_(options), scale_(options.init_scale) {}

  const Options options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_GRAD_SCALER_H_
