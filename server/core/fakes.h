// Hand-written fakes of the job manager's edges. Each records what it was asked so tests can read
// it back, and lets a test play the part of the world (a worker exiting, a store failing).
#ifndef FITRUN_SERVER_CORE_FAKES_H_
#define FITRUN_SERVER_CORE_FAKES_H_

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/device_inventory.h"
#include "server/core/job_store.h"
#include "server/core/memory_calibration.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

class FakeJobStore : public JobStore {
 public:
  absl::Status PutJob(const JobRecord& record) override {
    absl::MutexLock lock(&mu_);
    if (!put_status_.ok()) return put_status_;
    jobs_[record.job.id()] = record;
    return absl::OkStatus();
  }
  absl::Status AppendEvent(const fitrun::v1::JobEvent& event) override {
    absl::MutexLock lock(&mu_);
    if (!events_[event.job_id()].emplace(event.sequence(), event).second) {
      return absl::AlreadyExistsError("event sequence stored twice");
    }
    return absl::OkStatus();
  }
  absl::Status AppendEvents(absl::Span<const fitrun::v1::JobEvent> events) override {
    absl::MutexLock lock(&mu_);
    ++append_batches_;
    for (const fitrun::v1::JobEvent& event : events) {
      if (events_[event.job_id()].count(event.sequence()) > 0) {
        return absl::AlreadyExistsError("event sequence stored twice");  // before storing any
      }
    }
    for (const fitrun::v1::JobEvent& event : events) events_[event.job_id()].emplace(event.sequence(), event);
    return absl::OkStatus();
  }
  // How many AppendEvents calls there were (each one transaction in a real store).
  int append_batches() {
    absl::MutexLock lock(&mu_);
    return append_batches_;
  }
  absl::StatusOr<std::vector<JobRecord>> LoadJobs() override {
    absl::MutexLock lock(&mu_);
    std::vector<JobRecord> out;
    for (const auto& [id, record] : jobs_) out.push_back(record);
    return out;
  }
  absl::StatusOr<int64_t> LastEventSequence(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(job_id);
    return it == events_.end() || it->second.empty() ? 0 : it->second.rbegin()->first;
  }
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                                int limit) override {
    absl::MutexLock lock(&mu_);
    std::vector<fitrun::v1::JobEvent> out;
    for (auto it = events_[job_id].lower_bound(from_sequence); it != events_[job_id].end() && static_cast<int>(out.size()) < limit; ++it) {
      out.push_back(it->second);
    }
    return out;
  }
  void FailPuts(absl::Status status) {
    absl::MutexLock lock(&mu_);
    put_status_ = std::move(status);
  }
  size_t job_count() {
    absl::MutexLock lock(&mu_);
    return jobs_.size();
  }

 private:
  absl::Mutex mu_;
  absl::Status put_status_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<int64_t, fitrun::v1::JobEvent>> events_ ABSL_GUARDED_BY(mu_);
  int append_batches_ ABSL_GUARDED_BY(mu_) = 0;
};

// Records launches and stops; a test ends a worker with Exit(), which runs the exit callback as the
// real launcher's waiter thread would.
class FakeWorkerLauncher : public WorkerLauncher {
 public:
  absl::StatusOr<int> Launch(const WorkerLaunch& launch, ExitCallback on_exit) override {
    absl::MutexLock lock(&mu_);
    const int handle = static_cast<int>(launches_.size());
    launches_.push_back(launch);
    callbacks_.push_back(std::move(on_exit));
    return handle;
  }
  void Stop(int handle, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    stopped_.push_back(handle);
  }
  void KillIfStillRunningAfter(int handle, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    left_to_exit_.push_back(handle);
  }
  // Adopts the pids in adoptable() (set by the test); others are gone.
  absl::StatusOr<int> Adopt(int pid, const std::vector<std::pair<std::string, std::string>>&,
                            ExitCallback on_exit) override {
    absl::MutexLock lock(&mu_);
    if (!adoptable_.count(pid)) return absl::NotFoundError("gone");
    const int handle = static_cast<int>(launches_.size());
    WorkerLaunch adopted;
    adopted.argv = {"adopted:" + std::to_string(pid)};
    launches_.push_back(adopted);
    callbacks_.push_back(std::move(on_exit));
    adopted_.push_back(pid);
    return handle;
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
    ExitCallback callback;
    {
      absl::MutexLock lock(&mu_);
      callback = callbacks_.at(handle);
    }
    callback(WorkerExit{exit_code, signal, status_known});
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
    auto enough = [this, n] { return launches_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  absl::Mutex mu_;
  std::vector<WorkerLaunch> launches_ ABSL_GUARDED_BY(mu_);
  std::vector<ExitCallback> callbacks_ ABSL_GUARDED_BY(mu_);
  std::vector<int> stopped_ ABSL_GUARDED_BY(mu_);
  std::vector<int> left_to_exit_ ABSL_GUARDED_BY(mu_);
  std::set<int> adoptable_ ABSL_GUARDED_BY(mu_);
  std::vector<int> adopted_ ABSL_GUARDED_BY(mu_);
};

class FakeDeviceInventory : public DeviceInventory {
 public:
  // `count` CPU devices of `bytes` each.
  FakeDeviceInventory(int count, int64_t bytes) {
    for (int i = 0; i < count; ++i) {
      fitrun::v1::Device device;
      device.set_id("cpu:" + std::to_string(i));
      device.set_kind(fitrun::v1::DEVICE_KIND_CPU);
      device.set_total_bytes(bytes);
      device.set_free_bytes(bytes);
      device.set_cpu_threads(1);
      devices_.push_back(device);
    }
  }
  std::vector<fitrun::v1::Device> Snapshot() override { return devices_; }

 private:
  std::vector<fitrun::v1::Device> devices_;
};

class RecordingMetrics : public CoordinatorMetrics {
 public:
  void JobStateChanged(fitrun::v1::JobState from, fitrun::v1::JobState to) override {
    absl::MutexLock lock(&mu_);
    if (from != fitrun::v1::JOB_STATE_UNSPECIFIED) --jobs_by_state_[from];
    ++jobs_by_state_[to];
  }
  void EventRecorded(const std::string& kind) override {
    absl::MutexLock lock(&mu_);
    ++events_[kind];
  }
  void TrainingProgress(const std::string& job_id, int64_t steps_advanced, double loss) override {
    absl::MutexLock lock(&mu_);
    steps_ += steps_advanced;
    loss_[job_id] = loss;
  }
  void JobStopped(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    loss_.erase(job_id);
  }
  void OutOfMemory() override {
    absl::MutexLock lock(&mu_);
    ++out_of_memory_;
  }
  void JobRestarted(const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    ++restarts_[reason];
  }
  void Recovered(absl::Duration time_to_recover) override {
    absl::MutexLock lock(&mu_);
    recoveries_.push_back(time_to_recover);
  }
  int out_of_memory() {
    absl::MutexLock lock(&mu_);
    return out_of_memory_;
  }
  int restarts(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    return restarts_[reason];
  }
  std::vector<absl::Duration> recoveries() {
    absl::MutexLock lock(&mu_);
    return recoveries_;
  }
  int jobs_in(fitrun::v1::JobState state) {
    absl::MutexLock lock(&mu_);
    return jobs_by_state_[state];
  }
  int64_t steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  size_t running_loss_series() {
    absl::MutexLock lock(&mu_);
    return loss_.size();
  }

 private:
  absl::Mutex mu_;
  std::map<fitrun::v1::JobState, int> jobs_by_state_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> events_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, double> loss_ ABSL_GUARDED_BY(mu_);
  int out_of_memory_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> restarts_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> recoveries_ ABSL_GUARDED_BY(mu_);
};

// ---- memory probe ----
// Answers every probe with `result` (or `error`), counts the calls and records the specs; with
// Hold() probes wait until Release(), so a test can see a calibration in flight.
class FakeMemoryProbe : public MemoryProbe {
 public:
  explicit FakeMemoryProbe(ProbeResult result = {}) : result_(result) {}
  absl::StatusOr<ProbeResult> Probe(const fitrun::v1::JobSpec& spec) override {
    absl::MutexLock lock(&mu_);
    probed_.push_back(spec);
    auto released = [this] { return !held_; };
    mu_.Await(absl::Condition(&released));
    if (!error_.ok()) return error_;
    return result_;
  }
  void SetResult(ProbeResult result) {
    absl::MutexLock lock(&mu_);
    result_ = result;
    error_ = absl::OkStatus();
  }
  void Fail(absl::Status error) {
    absl::MutexLock lock(&mu_);
    error_ = std::move(error);
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }
  std::vector<fitrun::v1::JobSpec> probed() {
    absl::MutexLock lock(&mu_);
    return probed_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(probed_.size());
  }

 private:
  absl::Mutex mu_;
  ProbeResult result_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<fitrun::v1::JobSpec> probed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_FAKES_H_
