// A WorkerLauncher that starts nothing: it records launches and stops, and a test ends a worker with
// Exit(), which runs the exit callback as the real launcher's waiter thread would. Thread-safe.
#ifndef FITRUN_SERVER_CORE_TESTING_FAKE_WORKER_LAUNCHER_H_
#define FITRUN_SERVER_CORE_TESTING_FAKE_WORKER_LAUNCHER_H_

#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

class FakeWorkerLauncher : public WorkerLauncher {
 public:
  // Each rank becomes one entry of launches() (its index is the rank's pid and its number for Exit,
  // Stop and the other records); the rendezvous is 127.0.0.1:29500.
  absl::StatusOr<LaunchedAttempt> Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) override {
    absl::MutexLock lock(&mu_);
    if (!launch_error_.ok()) return launch_error_;
    attempts_.push_back(attempt);
    LaunchedAttempt launched;
    launched.handle = absl::StrCat("fake:", launches_.size());
    launched.master_addr = "127.0.0.1";
    launched.master_port = 29500;
    std::vector<int>& indices = indices_[launched.handle];
    indices.clear();
    for (size_t rank = 0; rank < attempt.ranks.size(); ++rank) {
      WorkerLaunch launch = attempt.ranks[rank];
      launch.env.emplace_back("MASTER_ADDR", launched.master_addr);
      launch.env.emplace_back("MASTER_PORT", absl::StrCat(launched.master_port));
      const int index = static_cast<int>(launches_.size());
      launches_.push_back(std::move(launch));
      callbacks_.push_back([on_exit, rank](const WorkerExit& exit) { on_exit(static_cast<int>(rank), exit); });
      indices.push_back(index);
      launched.pids.push_back(index);
    }
    return launched;
  }
  void Stop(const std::string& handle, int rank, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    stopped_.push_back(indices_.at(handle).at(rank));
  }
  void KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    left_to_exit_.push_back(indices_.at(handle).at(rank));
  }
  // Adopts the ranks whose recorded pids are in adoptable() (set by the test); others are gone. An
  // adopted rank gets a new entry in launches().
  std::vector<bool> Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) override {
    absl::MutexLock lock(&mu_);
    std::vector<bool> adopted(attempt.pids.size(), false);
    std::vector<int>& indices = indices_[attempt.handle];
    indices.assign(attempt.pids.size(), -1);
    for (size_t rank = 0; rank < attempt.pids.size(); ++rank) {
      const int pid = attempt.pids[rank];
      if (!attempt.maybe_running[rank] || !adoptable_.count(pid)) continue;
      WorkerLaunch launch;
      launch.argv = {"adopted:" + std::to_string(pid)};
      indices[rank] = static_cast<int>(launches_.size());
      launches_.push_back(launch);
      callbacks_.push_back([on_exit, rank](const WorkerExit& exit) { on_exit(static_cast<int>(rank), exit); });
      adopted_.push_back(pid);
      adopted[rank] = true;
    }
    return adopted;
  }
  void Release(const std::string& handle) override {
    absl::MutexLock lock(&mu_);
    released_.push_back(handle);
  }
  // Launches fail with `error` from now on (OK again: they succeed).
  void FailLaunches(absl::Status error) {
    absl::MutexLock lock(&mu_);
    launch_error_ = std::move(error);
  }
  void SetAdoptable(std::set<int> pids) {
    absl::MutexLock lock(&mu_);
    adoptable_ = std::move(pids);
  }
  std::vector<int> adopted() {
    absl::MutexLock lock(&mu_);
    return adopted_;
  }
  // Ends the worker with this handle (callback runs on the caller's thread, outside the fake's lock).
  void Exit(int handle, int exit_code, int signal = 0, bool status_known = true) {
    WorkerExit exit;
    exit.exit_code = exit_code;
    exit.signal = signal;
    exit.status_known = status_known;
    ExitWith(handle, exit);
  }
  // Ends the worker with this handle as `exit` says (a host memory OOM, say).
  void ExitWith(int handle, const WorkerExit& exit) {
    std::function<void(const WorkerExit&)> callback;
    {
      absl::MutexLock lock(&mu_);
      callback = callbacks_.at(handle);
    }
    callback(exit);
  }
  // Every attempt launched, as the manager assembled it.
  std::vector<AttemptLaunch> attempts() {
    absl::MutexLock lock(&mu_);
    return attempts_;
  }
  // The handles of the attempts released, in order.
  std::vector<std::string> released() {
    absl::MutexLock lock(&mu_);
    return released_;
  }
  std::vector<WorkerLaunch> launches() {
    absl::MutexLock lock(&mu_);
    return launches_;
  }
  std::vector<int> stopped() {
    absl::MutexLock lock(&mu_);
    return stopped_;
  }
  // Handles of workers left to exit on their own (killed only after the grace).
  std::vector<int> left_to_exit() {
    absl::MutexLock lock(&mu_);
    return left_to_exit_;
  }
  bool WaitForLaunches(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return launches_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  absl::Mutex mu_;
  std::vector<WorkerLaunch> launches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(const WorkerExit&)>> callbacks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<int>> indices_ ABSL_GUARDED_BY(mu_);
  absl::Status launch_error_ ABSL_GUARDED_BY(mu_);
  std::vector<int> stopped_ ABSL_GUARDED_BY(mu_);
  std::vector<int> left_to_exit_ ABSL_GUARDED_BY(mu_);
  std::set<int> adoptable_ ABSL_GUARDED_BY(mu_);
  std::vector<int> adopted_ ABSL_GUARDED_BY(mu_);
  std::vector<AttemptLaunch> attempts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> released_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_TESTING_FAKE_WORKER_LAUNCHER_H_
