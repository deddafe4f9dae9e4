#ifndef FITRUN_WORKER_DDP_GRADIENT_SYNCHRONIZER_H_
#define FITRUN_WORKER_DDP_GRADIENT_SYNCHRONIZER_H_

#include "absl/status/statusor.h"

namespace fitrun::worker {

// Makes every rank's gradients the mean over all ranks, once per optimizer step. The trainer calls,
// on its own thread and in this order for each step:
//
//   for each micro-batch m of the step:  BeforeBackward(m is the last);  loss.backward();
//   Synchronize(local_loss);
//
// so an implementation may reduce everything after the last backward (FlatAllReduceSynchronizer) or
// start bucket all-reduces from autograd hooks during the last backward and only wait in Synchronize.
// Gradients of earlier micro-batches just accumulate locally: only the last backward's are reduced.
class GradientSynchronizer {
 public:
  virtual ~GradientSynchronizer() = default;

  // Called before each micro-batch's backward; `last_micro_batch` says whether this backward
  // completes the step's gradients.
  virtual void BeforeBackward(bool last_micro_batch) = 0;

  // Called after the step's last backward. Replaces every gradient with its mean over ranks (as the
  // communication hook computes it: a compressing hook's is approximate, the same on every rank) and
  // returns the exact mean over ranks of `local_loss` (this rank's mean loss for the step). An error means
  // a collective failed (a peer died or timed out; the process group is not usable afterwards), or,
  // ResourceExhausted, that the device's memory ran out.
  virtual absl::StatusOr<double> Synchronize(double local_loss) = 0;
};

// The synchronizer of a single process: gradients are already the mean, the loss is already global.
class LocalGradientSynchronizer final : public GradientSynchronizer {
 public:
  void BeforeBackward(bool) override {}
  absl::StatusOr<double> Synchronize(double local_loss) override { return local_loss; }
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_GRADIENT_SYNCHRONIZER_H_
