// The training programs a rank can run (worker/runtime/rank_runtime.h). The built-in one trains a
// spec's model on its dataset with fitrun's own DDP trainer.
#ifndef FITRUN_WORKER_PROGRAMS_BUILTIN_TRAINING_H_
#define FITRUN_WORKER_PROGRAMS_BUILTIN_TRAINING_H_

#include <memory>

#include "worker/options.h"
#include "worker/runtime/rank_runtime.h"

namespace fitrun::worker {

// Reads the assignment (FITRUN_ASSIGNMENT), loads the workload, joins the process group, resumes
// from the newest checkpoint, trains, and reports how it went.
std::unique_ptr<TrainingProgram> MakeBuiltinTraining(const WorkerOptions& options);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROGRAMS_BUILTIN_TRAINING_H_
