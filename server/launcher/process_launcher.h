// Worker processes on this machine, one at a time (LocalLauncher starts an attempt's ranks with it):
// posix_spawn (no shell), each worker in its own process group
// with stdout and stderr appended to its log file, one waiter thread per worker that notices its
// exit the moment it happens, and a reaper that SIGKILLs workers still alive after their grace.
//
// Thread-safe. The destructor kills every worker still running and joins its threads.
#ifndef FITRUN_SERVER_LAUNCHER_PROCESS_LAUNCHER_H_
#define FITRUN_SERVER_LAUNCHER_PROCESS_LAUNCHER_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

class ProcessLauncher {
 public:
  // Runs once per started or adopted worker, on a waiter thread; must not block for long.
  using ExitCallback = std::function<void(const WorkerExit&)>;
  ProcessLauncher();
  ~ProcessLauncher();

  // Starts the worker, in the cgroups whose cgroup.procs files are given (none: fitrund's own);
  // returns its pid (and process group id).
  absl::StatusOr<int> Launch(const WorkerLaunch& launch, ExitCallback on_exit,
                             const std::vector<std::string>& cgroup_procs_files = {});
  // Starts `argv` as a warm rank (launch_contract.h's kWarmFd), as `run_as` (unset: fitrund's user),
  // its output discarded until it takes a job, recognisable by FITRUN_WARM_RANK=`warm_id`. Returns
  // its pid and the write end of its identity pipe, close-on-exec, for the caller alone to hold.
  struct Warm {
    int pid = 0;
    int identity_fd = -1;
  };
  absl::StatusOr<Warm> StartWarm(const std::vector<std::string>& argv, const std::optional<UnixAccount>& run_as,
                                 const std::string& warm_id, ExitCallback on_exit);
  // SIGTERM to the worker's process group, SIGKILL if still alive after `grace`.
  void Stop(int pid, absl::Duration grace);
  // No SIGTERM (the worker is sending its last words), but SIGKILL if still alive after `grace`.
  void KillIfStillRunningAfter(int pid, absl::Duration grace);
  // Takes over a worker started by an earlier coordinator: `pid` must be alive and carry every
  // variable of `expected_env` (so a recycled pid is never adopted); NOT_FOUND when it is gone.
  // Watches it through a pidfd, which works for processes that are not our children.
  absl::StatusOr<int> Adopt(int pid, const std::vector<std::pair<std::string, std::string>>& expected_env,
                            ExitCallback on_exit);

 private:
  void Wait(pid_t pid, int64_t waiter, ExitCallback on_exit);
  void WaitAdopted(pid_t pid, int pidfd, int64_t waiter, ExitCallback on_exit);
  void StartWaiter(std::function<void(int64_t)> body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KillerLoop();

  absl::Mutex mu_;
  // Workers not yet reaped; a pid leaves this set before it is reaped, so a signal is never sent
  // to a recycled pid.
  std::map<pid_t, bool> alive_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, pid_t> kill_deadlines_ ABSL_GUARDED_BY(mu_);
  // Waiter threads (keyed by launch, since pids are recycled); finished ones are joined at the next
  // launch so a long-lived daemon does not accumulate them.
  std::map<int64_t, std::thread> waiters_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> finished_waiters_ ABSL_GUARDED_BY(mu_);
  int64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread killer_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
absl::StatusOr<int> PickFreeTcpPort();

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_PROCESS_LAUNCHER_H_
