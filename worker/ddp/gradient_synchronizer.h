#ifndef FITRUN_WORKER_DDP_GRADIENT_SYNCHRONIZER_H_
#define FITRUN_WORKER_DDP_GRADIENT_SYNCHRONIZER_H_

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fitrun::worker {

// Makes every rank's gradients the mean over all ranks, once per optimizer step. The trainer calls,
// on its own thread and in this order for each step:
//
//   for each micro-batch m of the step:  BeforeBackward(m is the last);  loss.backward();
//   SynchronizeWithLoss(local_loss);
//
// so an implementation may reduce everything after the last backward (FlatAllReduceSynchronizer) or
// start bucket all-reduces from autograd hooks during the last backward and only wait in
// SynchronizeWithLoss. Gradients of earlier micro-batches just accumulate locally: only the last
// backward's are reduced.
class GradientSynchronizer {
 public:
  virtual ~GradientSynchronizer() = default;

  // Called before each micro-batch's backward; `last_micro_batch` says whether this backward
  // completes the step's gradients.
  virtual void BeforeBackward(bool last_micro_batch) = 0;

  // Called after the step's last backward. Replaces every gradient with its mean over ranks (as the
  // communication hook computes it: a compressing hook's is approximate, the same on every rank) and
  // returns the exact mean over ranks of `local_loss` (this rank's mean loss for the step, a
  // one-element floating-point tensor) as a one-element tensor of its own, on the gradients' device
  // or the loss's, and not read back: on a GPU the host need not wait for the step to end. Read as a
  // double, it is what Synchronize returns. An error means a collective failed (a peer died or timed
  // out; the process group is not usable afterwards), or, ResourceExhausted, that the device's memory
  // ran out.
  virtual absl::StatusOr<at::Tensor> SynchronizeWithLoss(const at::Tensor& local_loss) = 0;

  // How long the training thread has been held up by communication so far, over every step: the
  // collectives it ran or started itself and its waits for those backward did not hide. Zero for a
  // synchronizer that communicates with no one.
  virtual absl::Duration ExposedCommunication() const { return absl::ZeroDuration(); }

  // The same for a loss held on the host, the mean read back (tests, and callers without a device).
  absl::StatusOr<double> Synchronize(double local_loss) {
    absl::StatusOr<at::Tensor> mean = SynchronizeWithLoss(at::scalar_tensor(local_loss, at::kDouble));
    if (!mean.ok()) return mean.status();
    return mean->item<double>();
  }
};

// The synchronizer of a single process: gradients are already the mean, the loss is already global.
class LocalGradientSynchronizer final : public GradientSynchronizer {
 public:
  void BeforeBackward(bool) override {}
  absl::StatusOr<at::Tensor> SynchronizeWithLoss(const at::Tensor& local_loss) override { return local_loss; }
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_GRADIENT_SYNCHRONIZER_H_
