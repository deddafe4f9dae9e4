// What an attempt's ranks are started with: the assignment file every rank reads (spec, plan,
// checkpoint and dataset cache directories, each rank's memory cap and threads) and each rank's argv, environment (the
// torchrun contract but the rendezvous, which the launcher chooses, plus fitrun's own variables),
// working directory and log file. The job manager
// decides when an attempt starts; this decides what it starts.
#ifndef FITRUN_SERVER_CORE_JOBS_ATTEMPT_LAUNCH_H_
#define FITRUN_SERVER_CORE_JOBS_ATTEMPT_LAUNCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

struct AttemptLaunchSettings {
  std::string worker_binary;
  // The WorkerChannel address ranks dial, and the CA they verify it with (empty: plain text).
  std::string worker_channel_address;
  std::string worker_tls_ca;
  // Where ranks keep decoded datasets (WorkerAssignment.dataset_cache_dir; fitrund's
  // <state_dir>/datasets, or under --shared_dir); empty: every rank decodes its dataset.
  std::string dataset_cache_dir;
  // What a script job's ranks run: fitrun-supervisor (no LibTorch beside the script's); empty:
  // worker_binary.
  std::string script_binary;
  // The most host memory a rank may have (--max_rank_host_memory; 0: no ceiling): a rank's default
  // stays under it (a spec above it is refused at submit).
  int64_t max_rank_host_memory_bytes = 0;
};

// The host memory one rank may use (spec.resources.host_memory): the spec's, or by default
// `default_bytes` (DefaultRankHostMemory) but no more than `ceiling` (0: none).
int64_t HostMemoryPerRank(const fitrun::v1::JobSpec& spec, int64_t default_bytes, int64_t ceiling);
// What a rank on the device takes by default: a CPU device's memory (host memory, which the rank's
// tensors fill) plus kRankProcessHostBytes for the process itself; kGpuRankHostBytes on a GPU.
int64_t DefaultRankHostMemory(const fitrun::v1::Device& device);
// Tasks (processes and threads) one rank may have: spec.resources.max_processes, 512 when unset.
int64_t ProcessesPerRank(const fitrun::v1::JobSpec& spec);

// Writes <job_dir>/attempt-<attempt>/assignment.textproto (creating the attempt's and the
// checkpoints' directories; for a job that runs as its owner's account (Job.run_as) the job's
// directory and everything in it belong to that account, mode 0700, made and written as it through
// OwnedDirectory, and its ranks' decoded datasets go to a cache directory of the account's own) and returns the attempt to launch: one launch per rank of `plan`, and
// what a launcher asking a scheduler for nodes needs (the plan's nodes, each rank's threads, GPU and
// host memory, the spec's time limit), and what a launcher confining the attempt bounds (its ranks'
// host memory and tasks together). `devices` is the inventory (for each rank's cap and threads);
// `token` the job's secret its ranks present. The allocation callback is the caller's to set.
absl::StatusOr<AttemptLaunch> AssembleAttempt(const fitrun::v1::Job& job, const std::string& token,
                                                          int attempt, const fitrun::v1::Plan& plan,
                                                          const std::vector<fitrun::v1::Device>& devices,
                                                          const std::string& job_dir,
                                                          const AttemptLaunchSettings& settings);

// An attempt reserved under the job manager's lock (Attempts::Reserve) and started without it
// (StartRanks): what the unlocked phase needs, copied, so that it touches no job entry.
struct PendingLaunch {
  std::string job_id;
  int attempt = 0;
  fitrun::v1::Job job;
  std::string token;
  std::vector<fitrun::v1::Device> devices;
  // Where the launch's time went so far (queue, plan); StartRanks adds its own.
  std::vector<LaunchPhase> phases;
  WorkerLauncher::RankExitCallback on_exit;
  AllocationCallback on_allocation;
};

// Writes the attempt's directory under `job_dir` (AssembleAttempt) and starts every rank through
// `launcher`, or none (the launcher's promise). Slow (files, a cgroup, spawning, a cluster's
// sbatch): never under the job manager's lock.
absl::StatusOr<LaunchedAttempt> StartRanks(PendingLaunch& launch, const std::string& job_dir,
                                           const AttemptLaunchSettings& settings, WorkerLauncher& launcher);

// "in 9.8 ms: plan 0.2 ms, job directory 1.1 ms, spawn 8.5 ms": where launching an attempt went.
std::string FormatLaunchPhases(const std::vector<LaunchPhase>& phases);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_ATTEMPT_LAUNCH_H_
