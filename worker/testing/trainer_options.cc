#include "worker/testing/trainer_options.h"

#include "absl/time/time.h"

namespace fitrun::worker::testing {

TrainerOptions SmallTrainerOptions() {
  TrainerOptions options;
  options.per_device_batch = 16;
  options.grad_accum_steps = 2;
  options.learning_rate = 0.05;
  options.total_steps = 12;
  options.seed = 3;
  options.optimizer.set_momentum(0.9);
  options.progress_interval = absl::ZeroDuration();
  return options;
}

TrainerOptions SmallTrainerOptions(int rank, int world_size, int64_t per_device_batch, int grad_accum_steps) {
  TrainerOptions options = SmallTrainerOptions();
  options.rank = rank;
  options.world_size = world_size;
  options.per_device_batch = per_device_batch;
  options.grad_accum_steps = grad_accum_steps;
  return options;
}

}  // namespace fitrun::worker::testing
