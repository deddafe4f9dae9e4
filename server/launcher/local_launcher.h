// WorkerLauncher on this machine: every rank of an attempt a child process of fitrund
// (ProcessLauncher), meeting at the c10d store fitrund holds for the attempt on 127.0.0.1
// (rendezvous_store.h: bound before the first rank starts, until the attempt is released, served
// to the job's account only; the ranks are its clients, as torchrun's are of its agent's store). The
// attempt's handle is LocalLaunchHandle of its ranks' pids.
//
// With job cgroups (server/sandbox/job_cgroup.h), each attempt's ranks start in a cgroup of their
// own (named for the job and the attempt, so a restarted fitrund re-opens it when it adopts the
// ranks), bounded by the attempt's host memory and tasks. A rank's exit after the kernel's OOM
// killer struck in it says so (WorkerExit::host_memory_oom). Release kills whatever is left in it
// (a script's double-forked daemon) and removes it, on a thread of the launcher's own.
//
// Thread-safe. The destructor kills every rank and everything in the cgroups it holds.
#ifndef FITRUN_SERVER_LAUNCHER_LOCAL_LAUNCHER_H_
#define FITRUN_SERVER_LAUNCHER_LOCAL_LAUNCHER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/worker_launcher.h"
#include "server/launcher/process_launcher.h"
#include "server/launcher/rendezvous_store.h"
#include "server/launcher/warm_ranks.h"
#include "server/sandbox/job_cgroup.h"

namespace fitrun::server {

class LocalLauncher : public WorkerLauncher {
 public:
  struct Options {
    // Unset (the default): each attempt meets at a RendezvousStore of its own. Set, for tests whose
    // ranks do not rendezvous: MASTER_PORT is what it returns, and nothing holds it.
    std::function<absl::StatusOr<int>()> pick_master_port;
    // Where attempts' cgroups are made (fitrund --job_cgroups); nullptr: ranks stay in fitrund's.
    // Must outlive the launcher.
    JobCgroups* cgroups = nullptr;
    // How a released cgroup is emptied and removed (KillAll, then Remove); tests put a failing one
    // here. A failure is tried again after retry_after, doubling up to max_retry_after, until the
    // cgroup is gone: nothing an attempt started outlives it for good.
    std::function<absl::Status(JobCgroup&)> kill_and_remove = KillAndRemove;
    absl::Duration retry_after = absl::Seconds(1);
    absl::Duration max_retry_after = absl::Minutes(1);
    // Warm ranks (warm_ranks.h): how many may idle at once (0: none) and the binary kept warm.
    int warm_ranks = 0;
    std::string worker_binary;
  };
  explicit LocalLauncher(std::function<absl::StatusOr<int>()> pick_master_port);
  explicit LocalLauncher(Options options);
  ~LocalLauncher() override;
  LocalLauncher(const LocalLauncher&) = delete;
  LocalLauncher& operator=(const LocalLauncher&) = delete;

  // With cgroups, the attempt's cgroup is made first (FAILED_PRECONDITION naming it when it cannot
  // be) and every rank joins it before it execs.
  absl::StatusOr<LaunchedAttempt> Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) override;
  void Stop(const std::string& handle, int rank, absl::Duration grace) override;
  void KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration grace) override;
  // A rank is adopted when its recorded pid is alive and carries the attempt's FITRUN_JOB_ID,
  // FITRUN_ATTEMPT and RANK, or, for a warm rank, the FITRUN_WARM_RANK its handle records. The
  // attempt's cgroup, when there is one, is re-opened by name. Its store went with the fitrund that
  // held it: ranks past their rendezvous do not use it again.
  std::vector<bool> Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) override;
  // Kills what is left in the attempt's cgroup and removes it (later, on the launcher's thread), and
  // closes its rendezvous.
  void Release(const std::string& handle) override;
  // Removes this coordinator's cgroups that no launched or adopted attempt holds (and memory
  // probes' of an earlier fitrund): their attempts ended while no coordinator watched.
  void ReleaseUnowned(const std::vector<std::string>& owned_handles) override;
  int64_t IdleHostBytes() const override;
  void ReleaseIdle() override;

 private:
  // An attempt's cgroup, the OOM kills in it that exits have reported so far, and, once released,
  // when its release is tried next (the releaser's, under the launcher's mu_).
  struct AttemptCgroup {
    std::unique_ptr<JobCgroup> cgroup;
    absl::Mutex mu;
    int64_t oom_kills_reported ABSL_GUARDED_BY(mu) = 0;
    absl::Time release_at = absl::InfinitePast();
    absl::Duration backoff;
  };

 public:
  // Kills what is in the cgroup and removes it (the default Options::kill_and_remove).
  static absl::Status KillAndRemove(JobCgroup& cgroup);

 private:
  // The pid of `rank` in `handle`, or 0 (with a log line) for a handle that is not this launcher's.
  static int PidOf(const std::string& handle, int rank);
  // Marks `exit` as a host memory OOM when the cgroup's OOM kills rose since the last exit.
  static void NoteHostMemory(AttemptCgroup& attempt, WorkerExit& exit);
  void Queue(std::shared_ptr<AttemptCgroup> attempt) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaserLoop();

  const Options options_;
  absl::Mutex mu_;
  // The cgroups of attempts launched or adopted and not released, by handle.
  std::map<std::string, std::shared_ptr<AttemptCgroup>> cgroups_ ABSL_GUARDED_BY(mu_);
  // The rendezvous of attempts launched and not released, by handle.
  std::map<std::string, std::unique_ptr<RendezvousStore>> stores_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<AttemptCgroup>> to_release_ ABSL_GUARDED_BY(mu_);
  // Per launched attempt with warm ranks on: one of its ranks and how many it had, for the warm ranks
  // its release starts.
  std::map<std::string, std::pair<WorkerLaunch, int>> refill_on_release_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread releaser_;
  ProcessLauncher processes_;
  // After processes_, so it lets its ranks go before processes_ reaps them; null without warm ranks.
  std::unique_ptr<WarmRanks> warm_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_LOCAL_LAUNCHER_H_
