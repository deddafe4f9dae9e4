// The training plan the trainer's tests start from, so that each test sets only what it is about.
#ifndef FITRUN_WORKER_TESTING_TRAINER_OPTIONS_H_
#define FITRUN_WORKER_TESTING_TRAINER_OPTIONS_H_

#include <cstdint>

#include "worker/trainer/trainer.h"

namespace fitrun::worker::testing {

// One rank, 16 samples a micro-batch and 2 micro-batches a step, SGD at 0.05 with momentum 0.9, 12
// steps from seed 3, and progress reported for every step (no throttle to make a test's count vary):
// a plan the built-in mlp learns on SyntheticSet in a few seconds of CPU.
TrainerOptions SmallTrainerOptions();

// The same plan as rank `rank` of `world_size` runs it, with its own batch split: for the tests that
// hold ranks and accumulation against one rank's run.
TrainerOptions SmallTrainerOptions(int rank, int world_size, int64_t per_device_batch, int grad_accum_steps);

}  // namespace fitrun::worker::testing

#endif  // FITRUN_WORKER_TESTING_TRAINER_OPTIONS_H_
