// The training program of a script job's rank: fitrun-worker supervises the user's own script
// (spec.script) as its child, the way torchrun runs one, and speaks for it to the coordinator.
#ifndef FITRUN_WORKER_PROGRAMS_SCRIPT_RANK_H_
#define FITRUN_WORKER_PROGRAMS_SCRIPT_RANK_H_

#include <memory>

#include "worker/options.h"
#include "worker/runtime/rank_runtime.h"

namespace fitrun::worker {

// Runs the script with the torchrun environment and the plan's FITRUN_* variables (the preloaded
// allocator enforcing the device's cap), forwards what the fitrun Python module reports, passes a
// StopCommand on (the control pipe, then SIGTERM), and turns the script's end into the rank's: exit
// 0 finishes, an out-of-memory error (reported, exit 3, or read on stderr) is an OutOfMemory, exit 2
// a configuration error, anything else a failure carrying the tail of its stderr.
std::unique_ptr<TrainingProgram> MakeScriptRank(const WorkerOptions& options);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROGRAMS_SCRIPT_RANK_H_
