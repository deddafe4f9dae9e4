// CoordinatorMetrics that keep what they are told, so a test reads back the counts and durations the
// manager reported. Thread-safe.
#ifndef FITRUN_SERVER_CORE_TESTING_RECORDING_METRICS_H_
#define FITRUN_SERVER_CORE_TESTING_RECORDING_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/coordinator_metrics.h"

namespace fitrun::server {

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

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_TESTING_RECORDING_METRICS_H_
