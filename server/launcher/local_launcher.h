// WorkerLauncher on this machine: every rank of an attempt a child process of fitrund
// (ProcessLauncher), meeting at 127.0.0.1 on a port that was free when the attempt launched. The
// attempt's handle is LocalLaunchHandle of its ranks' pids.
#ifndef FITRUN_SERVER_LAUNCHER_LOCAL_LAUNCHER_H_
#define FITRUN_SERVER_LAUNCHER_LOCAL_LAUNCHER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/worker_launcher.h"
#include "server/launcher/process_launcher.h"

namespace fitrun::server {

class LocalLauncher : public WorkerLauncher {
 public:
  explicit LocalLauncher(std::function<absl::StatusOr<int>()> pick_master_port = PickFreeTcpPort)
      : pick_master_port_(std::move(pick_master_port)) {}

  absl::StatusOr<LaunchedAttempt> Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) override;
  void Stop(const std::string& handle, int rank, absl::Duration grace) override;
  void KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration grace) override;
  // A rank is adopted when its recorded pid is alive and carries the attempt's FITRUN_JOB_ID,
  // FITRUN_ATTEMPT and RANK.
  std::vector<bool> Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) override;

 private:
  // The pid of `rank` in `handle`, or 0 (with a log line) for a handle that is not this launcher's.
  static int PidOf(const std::string& handle, int rank);

  const std::function<absl::StatusOr<int>()> pick_master_port_;
  ProcessLauncher processes_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_LOCAL_LAUNCHER_H_
