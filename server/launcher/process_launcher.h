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
  // SIGKILL to the worker's process group now (a warm rank that would not take its job).
  void KillNow(int pid);
  // Runs `body` while the worker `pid` cannot be reaped, so a pid `body` writes (into a cgroup's
  // cgroup.procs) is this worker's and no recycled one's; FAILED_PRECONDITION when it is gone.
  absl::Status WhileAlive(int pid, const std::function<absl::Status()>& body);

  // What a worker started by an earlier coordinator must be for Adopt to take it over, since any
  // account can start a process with any environment and a pid is recycled: every variable of `env`,
  // the Unix account `uid` as its real uid, the start time recorded at its launch (`start_ticks`,
  // /proc/<pid>/stat's; 0 for a launch recorded before fitrund kept it), and, when `in_cgroup` is
  // set, its attempt's cgroup.
  struct Identity {
    std::vector<std::pair<std::string, std::string>> env;
    uid_t uid = 0;
    int64_t start_ticks = 0;
    std::function<bool(int pid)> in_cgroup;
  };
  // Takes over a worker started by an earlier coordinator when it is alive and is `identity`;
  // NOT_FOUND (saying what differs) otherwise. Everything is read after a pidfd pins the process and
  // checked against the same pidfd afterwards, and it is watched and signalled through it, which
  // works for processes that are not our children.
  absl::StatusOr<int> Adopt(int pid, const Identity& identity, ExitCallback on_exit);

 private:
  void Wait(pid_t pid, int64_t waiter, ExitCallback on_exit);
  void WaitAdopted(pid_t pid, int pidfd, int64_t waiter, ExitCallback on_exit);
  // Signals a live worker and its process group: its pidfd first, which fails for a process that is
  // gone, so the group signal that follows never reaches a recycled pid's.
  void SignalLocked(pid_t pid, int signal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets a worker that exited, closing its pidfd.
  void ForgetLocked(pid_t pid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartWaiter(std::function<void(int64_t)> body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KillerLoop();

  absl::Mutex mu_;
  // Workers not yet reaped, with a pidfd of each; a pid leaves this map before it is reaped, so a
  // signal is never sent to a recycled pid.
  std::map<pid_t, int> alive_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, pid_t> kill_deadlines_ ABSL_GUARDED_BY(mu_);
  // Waiter threads (keyed by launch, since pids are recycled); finished ones are joined at the next
  // launch so a long-lived daemon does not accumulate them.
  std::map<int64_t, std::thread> waiters_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> finished_waiters_ ABSL_GUARDED_BY(mu_);
  int64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread killer_;
};

// /proc/<pid>/<name> whole; empty when the process is gone, also between the open and the read
// (ESRCH). Read with read(2): a stream's buffer throws on that failed read where no istream catches it.
std::string ReadProcFile(pid_t pid, const char* name);

// When the process started, in clock ticks after boot (/proc/<pid>/stat's 22nd field); 0 when it
// cannot be read. With the pid, it names one process for the whole boot.
int64_t ProcessStartTicks(int pid);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_PROCESS_LAUNCHER_H_
