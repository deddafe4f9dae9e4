// WorkerLauncher on a Slurm cluster: an attempt is one batch job (sbatch), its ranks one srun step
// of it, each under worker/slurm/rank_shim.sh. The handle is "slurm:<job id>".
//
// Slurm places, starts, signals and accounts for the ranks; this launcher only talks to it through
// its client commands (sbatch, squeue, scontrol, scancel; the cluster is the one SLURM_CONF names, as
// for any Slurm client) and learns:
//   - the allocation's state (PENDING and Slurm's reason, RUNNING, how it ended) by polling squeue,
//     then scontrol for jobs squeue no longer lists, with backoff while nothing changes;
//   - each rank's own exit status from the shim's rank-<r>.exit files in the attempt's directory
//     (which must be on storage fitrund sees: --shared_dir); a rank the allocation's end left without
//     one was killed (scancel, node failure, time limit).
// The ranks' own reports over gRPC remain the truth about training, as locally.
//
// Every Slurm command runs on the launcher's one thread but sbatch (Launch must return the job id)
// and the start-up sweep of ReleaseUnowned: Stop and KillIfStillRunningAfter only record what to do,
// so the job manager never waits on slurmctld under its lock (it calls Launch with the lock
// released). Callbacks run on that thread with no launcher lock held.
#ifndef FITRUN_SERVER_LAUNCHER_SLURM_LAUNCHER_H_
#define FITRUN_SERVER_LAUNCHER_SLURM_LAUNCHER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/worker_launcher.h"
#include "server/slurm/slurm_command.h"
#include "server/slurm/slurm_text.h"

namespace fitrun::server {

class SlurmLauncher : public WorkerLauncher {
 public:
  struct Options {
    std::string partition;  // sbatch --partition (empty: the cluster's default)
    std::string account;    // sbatch --account
    // More sbatch arguments (--slurm_sbatch_args), each one argument ("--qos=high").
    std::vector<std::string> extra_sbatch_args;
    // Marks this coordinator's allocations (sbatch --comment), so that a restarted one cancels the
    // orphans it left and nothing else. See CoordinatorTag.
    std::string coordinator_tag;
    // How long before its time limit Slurm warns the batch script (--signal=B:USR2@<seconds>).
    absl::Duration preemption_notice = absl::Seconds(60);
    absl::Duration min_poll_interval = absl::Milliseconds(250);
    absl::Duration max_poll_interval = absl::Seconds(5);
    slurm::SlurmRunner runner;  // default: slurm::RealSlurmRunner()
  };

  // The tag of the coordinator on `host` whose state directory is `state_dir`: stable across its
  // restarts, different for another coordinator.
  static std::string CoordinatorTag(const std::string& host, const std::string& state_dir);
  // "slurm:<id>" for a Slurm job id, and back (INVALID_ARGUMENT for another launcher's handle).
  static std::string HandleOf(const std::string& slurm_job_id);
  static absl::StatusOr<std::string> SlurmJobIdOf(const std::string& handle);
  // The batch script of an attempt, as written to <attempt dir>/slurm-batch.sh: exports what every
  // rank shares, finds the rendezvous (the first node's NodeAddr and a port from the Slurm job id),
  // and runs the ranks with srun under `shim`. The ranks must differ only in the torchrun variables
  // the shim sets (INVALID_ARGUMENT otherwise).
  static absl::StatusOr<std::string> BatchScript(const AttemptLaunch& attempt, const std::string& shim);
  // The sbatch command line that submits `script` for `attempt`.
  std::vector<std::string> SbatchArgv(const AttemptLaunch& attempt, const std::string& script) const;

  explicit SlurmLauncher(Options options);
  ~SlurmLauncher() override;
  SlurmLauncher(const SlurmLauncher&) = delete;
  SlurmLauncher& operator=(const SlurmLauncher&) = delete;

  absl::StatusOr<LaunchedAttempt> Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) override;
  // The first Stop of an attempt asks Slurm to pass SIGTERM to every process of the allocation
  // (scancel --signal=TERM --full) and to cancel it after `grace`; a pending allocation is cancelled
  // at once. Later calls for the same attempt only shorten the grace.
  void Stop(const std::string& handle, int rank, absl::Duration grace) override;
  void KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration grace) override;
  // Adopted: every rank that may run, when Slurm still lists the job as pending or running.
  std::vector<bool> Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) override;
  // Cancels this coordinator's pending or running allocations (by coordinator_tag, of this user) that
  // no stored attempt holds.
  void ReleaseUnowned(const std::vector<std::string>& owned_handles) override;

 private:
  // Why the Slurm job `job` is not the recorded attempt's (its user, its name, this coordinator's
  // comment); empty when it is.
  std::string NotThisJobs(const slurm::SlurmJobStatus& job, const RecordedAttempt& attempt) const;

  struct Tracked {
    // Where the shim's exit files are: <job_dir>/<attempt_dir_name>, the run_as account's.
    std::string job_dir;
    std::string attempt_dir_name;
    std::optional<UnixAccount> run_as;
    int world_size = 0;
    RankExitCallback on_exit;
    AllocationCallback on_allocation;
    std::vector<bool> reported;  // per rank: its exit was reported
    std::string last_status;     // the allocation status last reported
    bool stop_requested = false;  // SIGTERM to be sent
    bool stop_sent = false;
    std::optional<absl::Time> cancel_at;  // scancel once this passes
    bool cancel_sent = false;
  };

  void Track(const std::string& job_id, Tracked tracked) ABSL_LOCKS_EXCLUDED(mu_);
  // The allocation is cancelled once `grace` has passed; with signal_first, its processes get SIGTERM
  // on the next poll.
  void ScheduleStop(const std::string& handle, absl::Duration grace, bool signal_first) ABSL_LOCKS_EXCLUDED(mu_);
  void PollLoop();
  // One round: sends requested signals and cancels, asks Slurm about every tracked job, reports what
  // changed. Returns whether anything did.
  bool PollOnce();

  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, Tracked> tracked_ ABSL_GUARDED_BY(mu_);  // by Slurm job id
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  // An sbatch failed after it may have submitted (a timeout): the next poll cancels what it left.
  bool sweep_orphans_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_SLURM_LAUNCHER_H_
