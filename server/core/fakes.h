// Hand-written fakes of the job manager's edges. Each records what it was asked so tests can read
// it back, and lets a test play the part of the world (a worker exiting, a store failing).
#ifndef FITRUN_SERVER_CORE_FAKES_H_
#define FITRUN_SERVER_CORE_FAKES_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/device_inventory.h"
#include "server/core/job_store.h"
#include "server/core/calibration/memory_calibration.h"
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
  absl::Status AppendEventsAndPutJob(absl::Span<const fitrun::v1::JobEvent> events,
                                     const JobRecord& record) override {
    {
      absl::MutexLock lock(&mu_);
      if (!put_status_.ok()) return put_status_;  // all or none
    }
    if (absl::Status status = AppendEvents(events); !status.ok()) return status;
    return PutJob(record);
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
  absl::Status DeleteJobs(absl::Span<const std::string> job_ids) override {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : job_ids) {
      jobs_.erase(id);
      events_.erase(id);
    }
    return absl::OkStatus();
  }
  size_t event_count(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(job_id);
    return it == events_.end() ? 0 : it->second.size();
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
  // GPUs instead: `count` CUDA devices of `bytes` each named `name`, slices of `slice_bytes` when
  // it is set (ids "cuda:0#k" as the GPU offer names several slices of one GPU).
  static FakeDeviceInventory Gpus(int count, int64_t bytes, const std::string& name, int64_t slice_bytes = 0) {
    FakeDeviceInventory gpus(0, 0);
    for (int i = 0; i < count; ++i) {
      fitrun::v1::Device device;
      device.set_id(slice_bytes > 0 ? "cuda:0#" + std::to_string(i) : "cuda:" + std::to_string(i));
      device.set_kind(fitrun::v1::DEVICE_KIND_CUDA);
      device.set_name(name);
      device.set_total_bytes(slice_bytes > 0 ? slice_bytes : bytes);
      device.set_free_bytes(slice_bytes > 0 ? slice_bytes : bytes);
      device.set_slice_bytes(slice_bytes);
      device.set_cpu_threads(1);
      gpus.devices_.push_back(device);
    }
    return gpus;
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
  void TrainingProgress(int64_t steps_advanced) override {
    absl::MutexLock lock(&mu_);
    steps_ += steps_advanced;
  }
  void JobEnded(fitrun::v1::JobState state, absl::Duration queue_wait, absl::Duration duration) override {
    absl::MutexLock lock(&mu_);
    ended_.push_back({state, queue_wait, duration});
  }
  void CheckpointSaved(absl::Duration took) override {
    absl::MutexLock lock(&mu_);
    checkpoint_times_.push_back(took);
  }
  void CheckpointFailed() override {
    absl::MutexLock lock(&mu_);
    ++checkpoint_failures_;
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
  void MemoryPredictionObserved(double ratio) override {
    absl::MutexLock lock(&mu_);
    prediction_ratios_.push_back(ratio);
  }
  void MemoryProbeRan(absl::Duration took) override {
    absl::MutexLock lock(&mu_);
    probe_times_.push_back(took);
  }
  std::vector<double> prediction_ratios() {
    absl::MutexLock lock(&mu_);
    return prediction_ratios_;
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
  struct Ended {
    fitrun::v1::JobState state;
    absl::Duration queue_wait;
    absl::Duration duration;
  };
  std::vector<Ended> ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  std::vector<absl::Duration> checkpoint_times() {
    absl::MutexLock lock(&mu_);
    return checkpoint_times_;
  }
  int checkpoint_failures() {
    absl::MutexLock lock(&mu_);
    return checkpoint_failures_;
  }

 private:
  absl::Mutex mu_;
  std::map<fitrun::v1::JobState, int> jobs_by_state_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> events_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Ended> ended_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> checkpoint_times_ ABSL_GUARDED_BY(mu_);
  int checkpoint_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int out_of_memory_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> restarts_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> recoveries_ ABSL_GUARDED_BY(mu_);
  std::vector<double> prediction_ratios_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> probe_times_ ABSL_GUARDED_BY(mu_);
};

// ---- memory probe ----
// Plays a model whose peak at micro-batch b is `peak(b)`: every session answers from it (a peak
// past the session's budget is RESOURCE_EXHAUSTED, as the real probe's allocator refuses it). Counts
// sessions, records the specs and the batches measured; with Hold() sessions wait to start until
// Release(), so a test can see a calibration in flight; Fail() makes sessions fail to start.
class FakeMemoryProbe : public MemoryProbe {
 public:
  using PeakFunction = std::function<int64_t(int64_t)>;
  explicit FakeMemoryProbe(PeakFunction peak, int64_t model_state_bytes = 2678824, int64_t train_samples = 60000)
      : peak_(std::move(peak)), model_state_bytes_(model_state_bytes), train_samples_(train_samples) {}

  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> Start(const fitrun::v1::JobSpec& spec, int64_t max_bytes,
                                                            const std::string& run_as) override {
    (void)run_as;
    absl::MutexLock lock(&mu_);
    probed_.push_back(spec);
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
    mu_.Await(absl::Condition(&released));
    if (!error_.ok()) return error_;
    return std::unique_ptr<MemoryProbeSession>(new Session(this, max_bytes));
  }
  void SetPeak(PeakFunction peak) {
    absl::MutexLock lock(&mu_);
    peak_ = std::move(peak);
  }
  // Each measurement's step then takes step_seconds(batch) (unset: not timed).
  void SetStepSeconds(std::function<double(int64_t)> step_seconds) {
    absl::MutexLock lock(&mu_);
    step_seconds_ = std::move(step_seconds);
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
  // Sessions started (sweeps and single measurements).
  int calls() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(probed_.size());
  }
  std::vector<int64_t> measured_batches() {
    absl::MutexLock lock(&mu_);
    return measured_;
  }

 private:
  class Session : public MemoryProbeSession {
   public:
    Session(FakeMemoryProbe* probe, int64_t max_bytes) : probe_(probe), max_bytes_(max_bytes) {}
    int64_t model_state_bytes() const override { return probe_->model_state_bytes_; }
    int64_t train_samples() const override { return probe_->train_samples_; }
    absl::StatusOr<int64_t> MeasurePeak(int64_t batch) override {
      absl::MutexLock lock(&probe_->mu_);
      probe_->measured_.push_back(batch);
      const int64_t peak = probe_->peak_(batch);
      if (max_bytes_ > 0 && peak > max_bytes_) return absl::ResourceExhaustedError("past the probe's budget");
      last_step_seconds_ = probe_->step_seconds_ ? probe_->step_seconds_(batch) : 0;
      return peak;
    }
    double last_step_seconds() const override { return last_step_seconds_; }

   private:
    FakeMemoryProbe* const probe_;
    const int64_t max_bytes_;
    double last_step_seconds_ = 0;
  };

  absl::Mutex mu_;
  PeakFunction peak_ ABSL_GUARDED_BY(mu_);
  std::function<double(int64_t)> step_seconds_ ABSL_GUARDED_BY(mu_);
  const int64_t model_state_bytes_;
  const int64_t train_samples_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<fitrun::v1::JobSpec> probed_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> measured_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_FAKES_H_
