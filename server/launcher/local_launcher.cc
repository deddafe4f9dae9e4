#include "server/launcher/local_launcher.h"

#include <atomic>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "proto/contract/launch_contract.h"

namespace fitrun::server {

namespace launch = fitrun::contract::launch;

absl::StatusOr<LaunchedAttempt> LocalLauncher::Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) {
  absl::StatusOr<int> port = pick_master_port_();
  if (!port.ok()) return port.status();
  LaunchedAttempt launched;
  launched.master_addr = "127.0.0.1";
  launched.master_port = *port;
  // Set when the attempt could not start whole: the ranks already started are killed and their
  // exits are not reported (the caller was told the attempt never started).
  auto abandoned = std::make_shared<std::atomic<bool>>(false);
  for (size_t rank = 0; rank < attempt.ranks.size(); ++rank) {
    WorkerLaunch one = attempt.ranks[rank];
    one.env.emplace_back(launch::kMasterAddr, launched.master_addr);
    one.env.emplace_back(launch::kMasterPort, absl::StrCat(launched.master_port));
    absl::StatusOr<int> pid = processes_.Launch(one, [on_exit, abandoned, rank](const WorkerExit& exit) {
      if (!abandoned->load()) on_exit(static_cast<int>(rank), exit);
    });
    if (!pid.ok()) {
      abandoned->store(true);
      for (int started : launched.pids) processes_.KillIfStillRunningAfter(started, absl::ZeroDuration());
      return absl::Status(pid.status().code(), absl::StrCat("rank ", rank, ": ", pid.status().message()));
    }
    launched.pids.push_back(*pid);
  }
  launched.handle = LocalLaunchHandle(launched.pids);
  return launched;
}

int LocalLauncher::PidOf(const std::string& handle, int rank) {
  absl::StatusOr<std::vector<int>> pids = PidsInLocalLaunchHandle(handle);
  if (!pids.ok() || rank < 0 || rank >= static_cast<int>(pids->size())) {
    std::fprintf(stderr, "fitrund: no rank %d in launch handle '%s'\n", rank, handle.c_str());
    return 0;
  }
  return (*pids)[rank];
}

void LocalLauncher::Stop(const std::string& handle, int rank, absl::Duration grace) {
  if (const int pid = PidOf(handle, rank); pid > 0) processes_.Stop(pid, grace);
}

void LocalLauncher::KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration grace) {
  if (const int pid = PidOf(handle, rank); pid > 0) processes_.KillIfStillRunningAfter(pid, grace);
}

std::vector<bool> LocalLauncher::Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) {
  std::vector<bool> adopted(attempt.pids.size(), false);
  for (size_t rank = 0; rank < attempt.pids.size(); ++rank) {
    if (rank >= attempt.maybe_running.size() || !attempt.maybe_running[rank] || attempt.pids[rank] <= 0) continue;
    absl::StatusOr<int> pid = processes_.Adopt(
        attempt.pids[rank],
        {{launch::kJobId, attempt.job_id},
         {launch::kAttempt, absl::StrCat(attempt.attempt)},
         {launch::kRank, absl::StrCat(rank)}},
        [on_exit, rank](const WorkerExit& exit) { on_exit(static_cast<int>(rank), exit); });
    adopted[rank] = pid.ok();
  }
  return adopted;
}

}  // namespace fitrun::server
