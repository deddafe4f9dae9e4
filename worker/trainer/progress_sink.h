#ifndef FITRUN_WORKER_TRAINER_PROGRESS_SINK_H_
#define FITRUN_WORKER_TRAINER_PROGRESS_SINK_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace fitrun::worker {

// One rank's progress after an optimizer step.
struct StepProgress {
  int rank = 0;
  int64_t step = 0;  // optimizer steps completed, 1-based
  int64_t total_steps = 0;
  int32_t epoch = 0;  // 1-based epoch the step belongs to
  double loss = 0;    // mean over all ranks of the step's loss
  double samples_per_second = 0;  // this rank's samples since its previous report
  // Since its previous report: the mean wall time of a step, and the share of that time the training
  // thread spent on gradient communication backward did not hide (GradientSynchronizer::
  // ExposedCommunication: sums it ran itself, collectives it started, waits). Built-in trainer only.
  double step_seconds = 0;
  double exposed_communication_share = 0;
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  // On a GPU: the caching allocator's reserved peak and the device's memory in use.
  int64_t reserved_peak_bytes = 0;
  int64_t device_peak_bytes = 0;
  // A script's own figures (run.report(metrics=...)); the built-in trainer sends none.
  std::map<std::string, double> metrics;
};

// A checkpoint rank 0 wrote (CheckpointSaved in the API), or could not write (`error` set:
// CheckpointFailed).
struct CheckpointNotice {
  int rank = 0;
  int64_t step = 0;
  std::string path;
  int64_t bytes = 0;
  double seconds = 0;  // how long writing it took
  std::string error;
};

// Where the trainer sends what it has to say. It knows nothing about how that travels (gRPC stream,
// log file), so it can be tested with a recording fake. Methods are called on the training thread
// and must return at once: a sink never blocks or slows training.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;

  virtual void OnProgress(const StepProgress& progress) = 0;
  virtual void OnLog(const std::string& text) = 0;
  // Sinks that have nowhere to put checkpoint events need not override it.
  virtual void OnCheckpoint(const CheckpointNotice& checkpoint) {}
  // Best effort: lets what was reported so far leave the process, waiting at most `timeout`. Only
  // called before a deliberate exit that skips normal shutdown.
  virtual void Flush(absl::Duration timeout) = 0;
};

// Writes progress and log lines to a stdio stream (the rank's log file). Thread-safe: stdio locks
// the stream for each line.
class ConsoleSink final : public ProgressSink {
 public:
  ConsoleSink(int rank, std::FILE* out) : rank_(rank), out_(out) {}

  void OnProgress(const StepProgress& progress) override;
  void OnLog(const std::string& text) override;
  void OnCheckpoint(const CheckpointNotice& checkpoint) override;
  void Flush(absl::Duration timeout) override;

 private:
  int rank_;
  std::FILE* out_;
};

// Sends everything to several sinks, in order. Does not own them.
class TeeSink final : public ProgressSink {
 public:
  explicit TeeSink(std::vector<ProgressSink*> sinks) : sinks_(std::move(sinks)) {}

  void OnProgress(const StepProgress& progress) override;
  void OnLog(const std::string& text) override;
  void OnCheckpoint(const CheckpointNotice& checkpoint) override;
  void Flush(absl::Duration timeout) override;

 private:
  std::vector<ProgressSink*> sinks_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_PROGRESS_SINK_H_
