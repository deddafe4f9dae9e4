#ifndef FITRUN_WORKER_TRAINER_LOSS_READBACK_H_
#define FITRUN_WORKER_TRAINER_LOSS_READBACK_H_

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fitrun::worker {

// The global losses of the steps the host has not read yet. Reading a loss that a GPU computed makes
// the host wait until the GPU has finished that step, and a host that waits every step leaves the GPU
// idle while it issues the next step's work. So the trainer keeps each step's loss where it was
// computed and reads the pending ones together, in one copy, only where a figure needs them: a
// progress report (its step's loss), the check for a diverging loss, a checkpoint, the end. On the CPU
// a read costs nothing, and the trainer reads every step as before.
//
// Thread-safety: owned by the training thread.
class LossReadback {
 public:
  // A loss that was not finite, and the first step it came from.
  struct NonFinite {
    int64_t step = 0;
    double loss = 0;
  };

  // The global loss of `step` (a one-element tensor on any device, not modified later), after those
  // of earlier steps.
  void Add(int64_t step, const at::Tensor& loss);

  // Reads every loss added since the last read, in one copy to the host (none when nothing is
  // pending).
  void ReadAll();

  // After ReadAll: the latest step read and its loss (0 and 0 before any).
  int64_t last_step() const { return last_step_; }
  double last_loss() const { return last_loss_; }
  // The earliest non-finite loss read so far, if any.
  const std::optional<NonFinite>& first_non_finite() const { return first_non_finite_; }
  bool pending() const { return !losses_.empty(); }

 private:
  std::vector<int64_t> steps_;
  std::vector<at::Tensor> losses_;
  int64_t last_step_ = 0;
  double last_loss_ = 0;
  std::optional<NonFinite> first_non_finite_;
};

// Whether the trainer reads the losses after `step` and stops on a non-finite one: every
// `interval_steps` steps, at every step a checkpoint follows and at the last step. A function of the
// step alone, so that every rank (each holds the same global loss) stops at the same step and none is
// left waiting in a collective; reads for progress reports, which follow each rank's own clock, only
// refresh the figures.
bool LossCheckDue(int64_t step, int64_t total_steps, int64_t interval_steps, int64_t checkpoint_every_steps);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_LOSS_READBACK_H_
