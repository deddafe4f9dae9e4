// Warm ranks (fitrund --warm_ranks): fitrun-worker processes started before their job, LibTorch
// loaded, each idling on a pipe until LocalLauncher hands it a rank of an attempt over that pipe
// (launch_contract.h's kWarmFd). A job placed on them skips the process start and the libraries'
// load, most of what stands between a launch and a rank's first report.
//
// The rules: a warm rank runs as the account it was started for and only ever takes a rank of a job
// run as that account (fitrund's own user where jobs are not run as accounts); it takes built-in
// jobs only (a script job's rank is fitrun-supervisor, started for its job); it holds no device
// memory while idle (nothing touches a device before its assignment does); at most `capacity` are
// idle at once, over every account, the longest idle let go first to make room; and an idle one
// exits the moment its pipe ends, which fitrund's exit (however it dies) makes happen.
//
// When an attempt of an account's built-in job is released (its ranks have all exited), the pool
// starts as many for the account, on a thread of its own, so the next job of a user who submits
// often finds them warm; not at launch, where loading LibTorch would compete with the job's own
// starting ranks for the cores.
//
// Thread-safe.
#ifndef FITRUN_SERVER_LAUNCHER_WARM_RANKS_H_
#define FITRUN_SERVER_LAUNCHER_WARM_RANKS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/worker_launcher.h"
#include "server/launcher/process_launcher.h"
#include "server/sandbox/job_cgroup.h"

namespace fitrun::server {

class WarmRanks {
 public:
  struct Options {
    // The binary kept warm: fitrund's fitrun-worker.
    std::string worker_binary;
    // Idle warm ranks at most, over every account; 0: none are kept.
    int capacity = 0;
  };
  // A rank handed to a job: its pid and the id a restarted fitrund recognises it by.
  struct Taken {
    int pid = 0;
    std::string warm_id;
  };

  // `processes` starts and reaps the ranks; it must outlive the pool.
  WarmRanks(ProcessLauncher* processes, Options options);
  // Close()s the pool.
  ~WarmRanks();
  WarmRanks(const WarmRanks&) = delete;
  WarmRanks& operator=(const WarmRanks&) = delete;

  // Hands `launch` (one rank of an attempt) to an idle warm rank of its account and binary, first
  // moving it into `cgroup` when there is one; `on_exit` then runs on its exit as for a rank started
  // for the job. nullopt when none was idle or the one found could not be moved or had died: the
  // caller starts the rank cold.
  std::optional<Taken> Take(const WorkerLaunch& launch, ProcessLauncher::ExitCallback on_exit,
                            const JobCgroup* cgroup) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts idle ranks in the background for ranks like `launch` (its account and binary; none for
  // any other binary) until its account has `count` (no more than capacity).
  void Refill(const WorkerLaunch& launch, int count) ABSL_LOCKS_EXCLUDED(mu_);
  // What the idle ranks hold of the host's memory (their anonymous resident pages), for the plans.
  int64_t IdleHostBytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Lets every idle rank go (each reads the end of its pipe and exits at once) and keeps none from
  // now on: fitrund is stopping. Ranks already handed a job are the job's.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One warm process. Its exit is routed through `on_exit` once it has a job; before, it only marks
  // the rank exited (the pool then forgets it).
  struct Rank {
    int pid = 0;
    int identity_fd = -1;
    std::string warm_id;
    std::optional<UnixAccount> account;
    absl::Mutex mu;
    bool exited ABSL_GUARDED_BY(mu) = false;
    ProcessLauncher::ExitCallback on_exit ABSL_GUARDED_BY(mu);
  };
  struct Request {
    std::optional<UnixAccount> account;
    int count = 0;
  };

  // Whether ranks like `launch` are kept warm: the worker binary, no arguments.
  bool Keeps(const WorkerLaunch& launch) const;
  static bool SameAccount(const std::optional<UnixAccount>& a, const std::optional<UnixAccount>& b);
  // Closes the rank's pipe: an idle rank then exits on its own.
  static void LetGo(Rank& rank);
  void StarterLoop();
  void DropExitedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ProcessLauncher* const processes_;
  const Options options_;
  mutable absl::Mutex mu_;
  // Idle ranks, the longest idle first.
  std::deque<std::shared_ptr<Rank>> idle_ ABSL_GUARDED_BY(mu_);
  std::deque<Request> requests_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread starter_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_WARM_RANKS_H_
