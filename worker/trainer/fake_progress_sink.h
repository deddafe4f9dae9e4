#ifndef FITRUN_WORKER_TRAINER_FAKE_PROGRESS_SINK_H_
#define FITRUN_WORKER_TRAINER_FAKE_PROGRESS_SINK_H_

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "worker/trainer/progress_sink.h"

namespace fitrun::worker {

// Records what a trainer reported so tests can read it back. Thread-safe.
class FakeProgressSink final : public ProgressSink {
 public:
  void OnProgress(const StepProgress& progress) override {
    absl::MutexLock lock(&mu_);
    progress_.push_back(progress);
  }
  void OnLog(const std::string& text) override {
    absl::MutexLock lock(&mu_);
    logs_.push_back(text);
  }
  void OnCheckpoint(const CheckpointNotice& checkpoint) override {
    absl::MutexLock lock(&mu_);
    checkpoints_.push_back(checkpoint);
  }
  void Flush(absl::Duration) override {
    absl::MutexLock lock(&mu_);
    ++flushes_;
  }

  std::vector<StepProgress> progress() const {
    absl::MutexLock lock(&mu_);
    return progress_;
  }
  std::vector<std::string> logs() const {
    absl::MutexLock lock(&mu_);
    return logs_;
  }
  std::vector<CheckpointNotice> checkpoints() const {
    absl::MutexLock lock(&mu_);
    return checkpoints_;
  }
  int flushes() const {
    absl::MutexLock lock(&mu_);
    return flushes_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<StepProgress> progress_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> logs_ ABSL_GUARDED_BY(mu_);
  std::vector<CheckpointNotice> checkpoints_ ABSL_GUARDED_BY(mu_);
  int flushes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_FAKE_PROGRESS_SINK_H_
