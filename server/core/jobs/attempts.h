// An attempt's life once it is on record: its reservation and commit around the unlocked start of
// its ranks (attempt_launch.h), its ranks' exits, allocation news, heartbeats and out-of-memory
// errors, what a failure leads to (failure_policy.h: a re-plan, a restart, or the job's end), its
// success, its stop and the release of its devices, and, after a coordinator restart, the take-over
// of the ranks its predecessor left.
//
// Thread-safety: none of its own. The job manager holds it under its lock, calls it with the entry
// of the job concerned, and does all waiting (an attempt still launching) itself.
#ifndef FITRUN_SERVER_CORE_JOBS_ATTEMPTS_H_
#define FITRUN_SERVER_CORE_JOBS_ATTEMPTS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/calibration/planning_gate.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/jobs/attempt_launch.h"
#include "server/core/jobs/device_holders.h"
#include "server/core/jobs/failure_policy.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/jobs/job_table.h"
#include "server/core/jobs/placement.h"
#include "server/core/jobs/run_memory.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

class Attempts {
 public:
  struct Options {
    std::string jobs_dir;
    // How long a stopped rank has between SIGTERM and SIGKILL, unless its spec says.
    absl::Duration stop_grace = absl::Seconds(2);
    // After every rank exited 0, how long to wait for reports still in flight before finishing.
    absl::Duration final_report_wait = absl::Seconds(3);
    // The operator's ceiling on one rank's host memory (for the advice after a host OOM); 0: none.
    int64_t max_rank_host_memory_bytes = 0;
    std::function<absl::Time()> clock;
    // Where an attempt's ranks' exits and allocation news go, for the launcher (the manager's
    // entry points, which take its lock and come back here).
    std::function<WorkerLauncher::RankExitCallback(const fitrun::v1::Job& job, int attempt)> exit_callback;
    std::function<AllocationCallback(const std::string& job_id, int attempt)> allocation_callback;
  };
  // Every pointer must outlive this.
  Attempts(Options options, JobTable* table, DeviceHolders* holders, WorkerLauncher* launcher,
           CoordinatorMetrics* metrics, RunMemory* run_memory, const PlanningGate* gate)
      : options_(std::move(options)),
        table_(table),
        holders_(holders),
        launcher_(launcher),
        metrics_(metrics),
        run_memory_(run_memory),
        gate_(gate) {}

  // ---- launch ----
  // The placed job's next attempt on record and its plan's devices held (the next placement sees
  // them taken), marked launching; returns what StartRanks needs. `placement`: the job's plan in
  // this pass and how long it took.
  PendingLaunch Reserve(JobEntry& entry, const Placement& placement);
  // The attempt started (RUNNING) or not (FAILED, devices freed). `stop_now`: the coordinator is
  // stopping every rank (its shutdown began while these started).
  void Commit(PendingLaunch& launch, absl::StatusOr<LaunchedAttempt> launched, bool stop_now);

  // ---- what its ranks say and do ----
  // A rank of attempt `key.attempt` exited; `log_tail`: its log's last lines, read beforehand.
  void OnRankExit(JobEntry& entry, const WorkerKey& key, const WorkerExit& exit, const std::string& log_tail);
  // The launcher's word on the attempt's allocation (a cluster scheduler's PENDING and its reason).
  void OnAllocation(JobEntry& entry, int attempt, const AllocationStatus& status);
  // A rank's OutOfMemory report: the attempt fails over, re-planned where that can help.
  void OnOutOfMemory(JobEntry& entry, const fitrun::v1::OutOfMemory& oom);
  // Succeeds the job once every rank exited 0 and reported its finish (or `deadline_passed`: the
  // wait for late reports is over).
  void MaybeSucceed(JobEntry& entry, bool deadline_passed);
  // Rank 0 saved a checkpoint of an attempt marked to move (RunMemory::AfterFirstSteps): restarts
  // it from there on the larger batch (the next scheduling pass plans it).
  void MoveAtCheckpoint(JobEntry& entry, int64_t checkpoint_step);
  // Fails over every running attempt with a rank silent past its heartbeat timeout; returns when the
  // next rank would time out (InfiniteFuture if none can).
  absl::Time CheckHeartbeats(absl::Time now);
  // Ends the waits for late final reports that are over by `now`; returns when the next one ends.
  absl::Time EndReportWaits(absl::Time now);

  // ---- its end ----
  // Ends the attempt's record with `outcome` (first outcome wins).
  void RecordOutcome(JobEntry& entry, const std::string& outcome);
  // Asks every live rank to stop (SIGTERM, SIGKILL after the grace).
  void StopRanks(JobEntry& entry, const std::string& reason);
  // Frees the attempt's devices once none of its processes is alive.
  void MaybeRelease(JobEntry& entry);

  // ---- after a coordinator restart ----
  // A job stored RUNNING: takes over the attempt's workers if every one is alive, otherwise stops
  // the survivors and restarts the job from its last checkpoint.
  void Recover(JobEntry& entry);
  // A job stored ending or restarting: the previous coordinator may have died while stopping its
  // ranks; stops whichever still live, so a restarted attempt never runs beside the old one.
  void StopLeftovers(JobEntry& entry);

 private:
  // A running attempt failed: stops every rank at once and either restarts the job (RESTARTING,
  // re-planned on the next scheduling pass) or, past the spec's limits, fails it. `headline` says
  // what happened in one line; `details` (e.g. a log tail) only goes into the failure reason.
  void HandleFailure(JobEntry& entry, FailureKind kind, const std::string& headline, const std::string& details = "");
  // What a rank's exit said about the attempt's host memory: the HostMemoryOom event, and the
  // headline's words (empty when the OOM killer had not struck).
  std::string OnHostMemoryOom(JobEntry& entry, const WorkerKey& key, const WorkerExit& exit);
  // "raise spec.resources.host_memory (each rank may use 2.25 GiB now, the default)".
  std::string RaiseHostMemoryAdvice(const JobEntry& entry);
  // Whether the job's current attempt runs on GPUs (where host memory does not follow the batch).
  bool RunsOnGpus(const JobEntry& entry);
  // Takes over the still-living workers of the job's last recorded attempt; returns how many it
  // adopted. The attempt becomes the job's active one.
  int AdoptLast(JobEntry& entry);
  absl::Duration StopGrace(const JobEntry& entry) const;

  const Options options_;
  JobTable* const table_;
  DeviceHolders* const holders_;
  WorkerLauncher* const launcher_;
  CoordinatorMetrics* const metrics_;
  RunMemory* const run_memory_;
  const PlanningGate* const gate_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_ATTEMPTS_H_
