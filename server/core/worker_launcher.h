// Starting and stopping an attempt's ranks, as the job manager sees it. The local implementation
// (server/launcher) spawns fitrun-worker processes; tests use a fake that records launches.
#ifndef FITRUN_SERVER_CORE_WORKER_LAUNCHER_H_
#define FITRUN_SERVER_CORE_WORKER_LAUNCHER_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fitrun::server {

struct WorkerLaunch {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  std::vector<std::string> argv;  // argv[0] is the binary's path; no shell is involved
  std::vector<std::pair<std::string, std::string>> env;
  std::string working_dir;
  std::string log_path;  // stdout and stderr go here
};

struct WorkerExit {
  int exit_code = 0;  // -1 when killed by a signal
  int signal = 0;
  // False for a worker adopted from an earlier coordinator: it is not our child, so its exit is
  // seen but its status is not.
  bool status_known = true;
};

// Every rank of one attempt, started together. The ranks' environments carry everything but the
// rendezvous (MASTER_ADDR, MASTER_PORT), which is the launcher's to choose: it knows where the ranks
// will run.
struct AttemptLaunch {
  std::string job_id;
  int attempt = 0;
  std::vector<WorkerLaunch> ranks;  // rank r at index r
};

// What the launcher started. `handle` is opaque to the job manager, which stores it with the attempt
// and hands it back to stop or re-adopt the ranks (the ranks' pids locally; a scheduler's job id
// elsewhere). `pids` has each rank's pid where the launcher knows it (0 where it does not).
struct LaunchedAttempt {
  std::string handle;
  std::vector<int> pids;
  std::string master_addr;
  int master_port = 0;
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
};

// The handle of ranks started as local processes: "pids:<rank 0's pid>,<rank 1's>,...". Attempts
// recorded before handles were stored were all local, so their handle is made from their pids.
std::string LocalLaunchHandle(const std::vector<int>& pids);
// The pids in a LocalLaunchHandle; INVALID_ARGUMENT for any other handle.
absl::StatusOr<std::vector<int>> PidsInLocalLaunchHandle(const std::string& handle);

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
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_WORKER_LAUNCHER_H_
