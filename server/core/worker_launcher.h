// Starting and stopping an attempt's ranks, as the job manager sees it. The local implementation
// (server/launcher) spawns fitrun-worker processes; tests use a fake that records launches.
#ifndef FITRUN_SERVER_CORE_WORKER_LAUNCHER_H_
#define FITRUN_SERVER_CORE_WORKER_LAUNCHER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/sandbox/unix_account.h"

namespace fitrun::server {

struct WorkerLaunch {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  std::vector<std::string> argv;  // argv[0] is the binary's path; no shell is involved
  std::vector<std::pair<std::string, std::string>> env;
  std::string working_dir;
  std::string log_path;  // stdout and stderr go here
  // The Unix account the rank runs as (the job's owner's); unset: fitrund's own user.
  std::optional<UnixAccount> run_as;
  // The job's secret the rank presents to fitrund (its Hello): never in `env`; each launcher hands
  // it over as launch_contract.h's kJobToken says.
  std::string job_token;
};

struct WorkerExit {
  int exit_code = 0;  // -1 when killed by a signal
  int signal = 0;
  // False for a worker adopted from an earlier coordinator: it is not our child, so its exit is
  // seen but its status is not.
  bool status_known = true;
  // The kernel's OOM killer stopped a process of the attempt since the last exit the launcher
  // reported (its cgroup's OOM kill count rose): the attempt reached its host memory limit. With
  // every exit of a confined attempt: that limit and the highest usage its cgroup saw so far (0
  // where unknown), which fitrund measured itself.
  bool host_memory_oom = false;
  int64_t host_memory_limit_bytes = 0;
  int64_t host_memory_peak_bytes = 0;
};

// What a cluster's batch scheduler says about an attempt's allocation, as the launcher last saw it.
// A launcher that starts ranks itself (the local one) never reports one.
struct AllocationStatus {
  // The ranks have their nodes (they may still be starting), or had them and the allocation ended.
  bool granted = false;
  // In the scheduler's words: "PENDING (Resources)", "RUNNING", "NODE_FAIL", ...
  std::string text;
};
using AllocationCallback = std::function<void(const AllocationStatus&)>;

// Every rank of one attempt, started together. The ranks' environments carry everything but the
// rendezvous (MASTER_ADDR, MASTER_PORT), which is the launcher's to choose: it knows where the ranks
// will run.
struct AttemptLaunch {
  std::string job_id;
  int attempt = 0;
  // The job's directory and, inside it, the attempt's (every rank's working directory). The job's
  // processes control what is in them: a launcher touches files there only through an
  // OwnedDirectory (server/sandbox/owned_directory.h) as the ranks' account.
  std::string job_dir;
  std::string attempt_dir_name;
  std::vector<WorkerLaunch> ranks;  // rank r at index r
  // What a launcher that asks a scheduler for the ranks' nodes asks for: the plan's nodes (empty on
  // one machine) with ranks_per_node each; per rank its CPU threads, a GPU or not, and its host memory
  // (0: unknown); the spec's time limit (0: none).
  std::vector<std::string> nodes;
  int ranks_per_node = 0;
  int cpus_per_rank = 1;
  bool gpu_per_rank = false;
  int64_t memory_per_rank_bytes = 0;
  int time_limit_minutes = 0;
  // What the attempt's processes may use together, for a launcher that confines them (local with
  // job cgroups): host memory in bytes (its ranks' spec.resources.host_memory) and tasks, threads
  // included (spec.resources.max_processes); 0: no limit.
  int64_t host_memory_limit_bytes = 0;
  int64_t max_processes = 0;
  // Called with every change of the allocation's status, on a launcher thread; may be empty.
  AllocationCallback on_allocation;
};

// One step of starting an attempt and how long it took, as the RUNNING event reports it (the
// launch-phase benchmark reads them there).
struct LaunchPhase {
  std::string name;
  absl::Duration took;
};

// What the launcher started. `handle` is opaque to the job manager, which stores it with the attempt
// and hands it back to stop or re-adopt the ranks (the ranks' pids locally; a scheduler's job id
// elsewhere). `pids` has each rank's pid where the launcher knows it (0 where it does not).
struct LaunchedAttempt {
  std::string handle;
  std::vector<int> pids;
  std::string master_addr;
  int master_port = 0;
  // Where the launch's time went, in order (empty where the launcher does not time its steps).
  std::vector<LaunchPhase> phases;
  // How many of the ranks were warm ranks (started before the job, handed it).
  int warm_ranks = 0;
};

// An attempt an earlier coordinator launched, as its record says.
struct RecordedAttempt {
  std::string job_id;
  int attempt = 0;
  std::string handle;
  // Per rank: its recorded pid (0: none), and whether the record says it may still run (it was not
  // seen exiting).
  std::vector<int> pids;
  std::vector<bool> maybe_running;
  AllocationCallback on_allocation;  // as AttemptLaunch's
  // As AttemptLaunch's, and the account its ranks run as (unset: fitrund's own user).
  std::string job_dir;
  std::string attempt_dir_name;
  std::optional<UnixAccount> run_as;
};

// The handle of ranks started as local processes: "pids:<rank 0's>,<rank 1's>,...", each rank its
// pid, "@<its start time>" when recorded (/proc/<pid>/stat's clock ticks after boot, so a restarted
// fitrund never takes a process that got the pid later for the rank), and for a warm rank
// "~<its FITRUN_WARM_RANK>" (`warm_ids`: per rank, empty for one started for its job; none: every
// rank). Attempts recorded before handles were stored were all local, so their handle is made from
// their pids.
std::string LocalLaunchHandle(const std::vector<int>& pids, const std::vector<std::string>& warm_ids = {},
                              const std::vector<int64_t>& start_ticks = {});
// The pids in a LocalLaunchHandle; INVALID_ARGUMENT for any other handle.
absl::StatusOr<std::vector<int>> PidsInLocalLaunchHandle(const std::string& handle);
// Per rank of a LocalLaunchHandle, its warm rank's id, empty for a rank started for its job.
absl::StatusOr<std::vector<std::string>> WarmIdsInLocalLaunchHandle(const std::string& handle);
// Per rank of a LocalLaunchHandle, its recorded start time (0: none recorded).
absl::StatusOr<std::vector<int64_t>> StartTicksInLocalLaunchHandle(const std::string& handle);

// Implementations are thread-safe. `on_exit` runs once per rank launched or adopted, on a launcher
// thread, and must not block for long.
class WorkerLauncher {
 public:
  using RankExitCallback = std::function<void(int rank, const WorkerExit&)>;
  virtual ~WorkerLauncher() = default;
  // Starts every rank of the attempt, or none: on an error nothing it started is left running and
  // `on_exit` is never called.
  virtual absl::StatusOr<LaunchedAttempt> Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) = 0;
  // Asks the rank to stop (SIGTERM) and kills it if still alive after `grace`.
  virtual void Stop(const std::string& handle, int rank, absl::Duration grace) = 0;
  // For a rank that said it is exiting (it reported an out-of-memory error and is sending its last
  // words): no SIGTERM, which would cut them off, but SIGKILL if still alive after `grace`.
  virtual void KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration grace) = 0;
  // Takes over the ranks of an attempt an earlier coordinator launched (never a process that merely
  // reuses a recorded pid); returns, per rank, whether it was adopted.
  virtual std::vector<bool> Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) = 0;
  // Called once a restarted coordinator has re-adopted its attempts, with every handle its stored
  // attempts hold: whatever this launcher started for this coordinator that none of them owns (an
  // allocation whose submit the previous coordinator's death interrupted before it was stored) is
  // cancelled. Never touches what another coordinator or user started.
  virtual void ReleaseUnowned(const std::vector<std::string>& owned_handles) { (void)owned_handles; }
  // Called once per launched or adopted attempt when none of its ranks is left (it ended, failed,
  // was cancelled or stopped for a restart): whatever the ranks started that still runs is killed
  // and what the attempt held (its cgroup) is freed. Must not block: the work may happen later.
  virtual void Release(const std::string& handle) { (void)handle; }
  // Host memory the launcher's own idle processes hold (warm ranks waiting for a job), which no job
  // may be promised.
  virtual int64_t IdleHostBytes() const { return 0; }
  // fitrund is stopping: the launcher's idle processes go now, before the rest of the shutdown.
  virtual void ReleaseIdle() {}
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_WORKER_LAUNCHER_H_
