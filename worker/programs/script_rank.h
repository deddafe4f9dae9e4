// The training program of a script job's rank: fitrun-worker supervises the user's own script
// (spec.script) as its child, the way torchrun runs one, and speaks for it to the coordinator.
#ifndef FITRUN_WORKER_PROGRAMS_SCRIPT_RANK_H_
#define FITRUN_WORKER_PROGRAMS_SCRIPT_RANK_H_

#include <memory>
#include <optional>
#include <string>

#include "fitrun/v1/job.pb.h"
#include "worker/options.h"
#include "worker/runtime/rank_runtime.h"

namespace fitrun::worker {

// Runs the script with the torchrun environment and the plan's FITRUN_* variables (the preloaded
// allocator enforcing the device's cap), forwards what the fitrun Python module reports, passes a
// StopCommand on (the control pipe, then SIGTERM), and turns the script's end into the rank's: exit
// 0 finishes, an out-of-memory error (reported, exit 3, or read on stderr) is an OutOfMemory, exit 2
// a configuration error, anything else a failure carrying the tail of its stderr.
std::unique_ptr<TrainingProgram> MakeScriptRank(const WorkerOptions& options);

// The CUDA_VISIBLE_DEVICES of rank `rank`'s script, as torchrun leaves it: every GPU of the job on
// this machine, in local-rank order (the plan's ranks on it in rank order; a slice "cuda:0#1" is on
// GPU 0), so that a script's torch.cuda.set_device(LOCAL_RANK) takes the rank's own GPU. Where
// LOCAL_RANK cannot index them (ranks sharing a GPU, or beside a CPU rank), only the rank's own GPU,
// as index 0. nullopt where the variable is not fitrun's to set: a CPU rank, or a rank on a cluster
// node ("n1/cuda:0"), whose scheduler binds it to its GPU (Slurm's --gpus-per-task) and hides the
// node's other GPUs from it.
std::optional<std::string> ScriptCudaVisibleDevices(const fitrun::v1::Plan& plan, int rank);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROGRAMS_SCRIPT_RANK_H_
