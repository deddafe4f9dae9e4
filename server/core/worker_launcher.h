// Starting and stopping worker processes, as the job manager sees it. The real implementation
// (server/launcher) spawns fitrun-worker; tests use a fake that records launches.
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

// Implementations are thread-safe. `on_exit` runs once per launched worker, on a launcher thread,
// and must not block for long.
class WorkerLauncher {
 public:
  using ExitCallback = std::function<void(const WorkerExit&)>;
  virtual ~WorkerLauncher() = default;
  // Starts the worker; returns a handle for Stop.
  virtual absl::StatusOr<int> Launch(const WorkerLaunch& launch, ExitCallback on_exit) = 0;
  // Asks the worker to stop (SIGTERM to its process group) and kills it if still alive after `grace`.
  virtual void Stop(int handle, absl::Duration grace) = 0;
  // For a worker that said it is exiting (it reported an out-of-memory error and is sending its
  // last words): no SIGTERM, which would cut them off, but SIGKILL if still alive after `grace`.
  virtual void KillIfStillRunningAfter(int handle, absl::Duration grace) = 0;
  // Takes over a worker started by an earlier coordinator: `pid` must be alive and carry every
  // variable of `expected_env` (so a recycled pid is never adopted). NOT_FOUND when it is gone.
  virtual absl::StatusOr<int> Adopt(int pid, const std::vector<std::pair<std::string, std::string>>& expected_env,
                                    ExitCallback on_exit) = 0;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_WORKER_LAUNCHER_H_
