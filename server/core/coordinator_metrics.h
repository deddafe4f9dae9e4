// What the job manager reports for monitoring, as a narrow interface so tests can read it back.
// The Prometheus implementation lives in server/metrics.
#ifndef FITRUN_SERVER_CORE_COORDINATOR_METRICS_H_
#define FITRUN_SERVER_CORE_COORDINATOR_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

// Implementations are thread-safe.
class CoordinatorMetrics {
 public:
  virtual ~CoordinatorMetrics() = default;
  // A job moved between states (from is UNSPECIFIED for a new job).
  virtual void JobStateChanged(fitrun::v1::JobState from, fitrun::v1::JobState to) = 0;
  // One event was recorded; `kind` is the event's oneof name ("progress", "oom", ...).
  virtual void EventRecorded(const std::string& kind) = 0;
  // Rank 0 of a running job advanced by `steps_advanced` optimizer steps. (Per-job and per-device
  // figures are read from the manager when scraped: see JobManager::Running and Devices.)
  virtual void TrainingProgress(int64_t steps_advanced) = 0;
  // A rank ran out of device memory.
  virtual void OutOfMemory() = 0;
  // A job's ranks were all stopped to be started again; `reason` is one of "out_of_memory", "crash",
  // "hang", "coordinator_restart".
  virtual void JobRestarted(const std::string& reason) = 0;
  // From a failure being detected to the next attempt's first training step.
  virtual void Recovered(absl::Duration time_to_recover) = 0;
  // One rank of a finished attempt peaked at `ratio` times its plan's predicted peak (the memory
  // estimator's error, as it runs).
  virtual void MemoryPredictionObserved(double ratio) = 0;
  // A memory probe (a calibration sweep or a single measurement) ran for `took`.
  virtual void MemoryProbeRan(absl::Duration took) = 0;
  // A job reached its final state `state` after waiting `queue_wait` for its first launch (its whole
  // life if it never launched) and `duration` from submission.
  virtual void JobEnded(fitrun::v1::JobState state, absl::Duration queue_wait, absl::Duration duration) = 0;
  // Rank 0 wrote a checkpoint in `took`, or could not write one.
  virtual void CheckpointSaved(absl::Duration took) = 0;
  virtual void CheckpointFailed() = 0;
};

// Records nothing; for tools and tests that do not look at metrics.
class NoopCoordinatorMetrics : public CoordinatorMetrics {
 public:
  void JobStateChanged(fitrun::v1::JobState, fitrun::v1::JobState) override {}
  void EventRecorded(const std::string&) override {}
  void TrainingProgress(int64_t) override {}
  void OutOfMemory() override {}
  void JobRestarted(const std::string&) override {}
  void Recovered(absl::Duration) override {}
  void MemoryPredictionObserved(double) override {}
  void MemoryProbeRan(absl::Duration) override {}
  void JobEnded(fitrun::v1::JobState, absl::Duration, absl::Duration) override {}
  void CheckpointSaved(absl::Duration) override {}
  void CheckpointFailed() override {}
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_COORDINATOR_METRICS_H_
