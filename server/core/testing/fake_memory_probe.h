// Plays a model whose peak at micro-batch b is `peak(b)`: every session answers from it (a peak
// past the session's budget is RESOURCE_EXHAUSTED, as the real probe's allocator refuses it). Counts
// sessions, records the specs and the batches measured; with Hold() sessions wait to start until
// Release(), so a test can see a calibration in flight; Fail() makes sessions fail to start.
#ifndef FITRUN_SERVER_CORE_TESTING_FAKE_MEMORY_PROBE_H_
#define FITRUN_SERVER_CORE_TESTING_FAKE_MEMORY_PROBE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/calibration/memory_calibration.h"

namespace fitrun::server {

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

#endif  // FITRUN_SERVER_CORE_TESTING_FAKE_MEMORY_PROBE_H_
