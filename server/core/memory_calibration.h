// Calibrated memory estimates: one rank's peak memory measured by running the model, cached.
//
// The analytic profiles (model_profile.h) are within a few tens of percent; a probe that runs real
// forward/backward/optimizer steps at two small micro-batch sizes under the worker's counting
// allocator measures peak(b) = fixed + per_sample * b exactly for the model, its optimizer and its
// precision. MemoryCalibrator runs such probes (through the MemoryProbe interface, a child process
// in fitrund: server/probe/process_memory_probe.h), caches their results by what changes memory
// (CalibrationKey), persists them in a file so a restarted coordinator does not probe again, and
// turns them into the calibrated ModelProfile the estimator and the planner use.
#ifndef FITRUN_SERVER_CORE_MEMORY_CALIBRATION_H_
#define FITRUN_SERVER_CORE_MEMORY_CALIBRATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/model_profile.h"

namespace fitrun::server {

// One rank's measured peak memory as the larger of two lines in the micro-batch b: the line through
// two large batches (fixed + per_sample * b: activations dominate) and the line through two small
// ones (small_fixed + small_per_sample * b: there, batch-independent costs such as the optimizer
// step's temporaries or a kernel's packed weights set the peak). A single line through small
// batches underestimates large ones when their per-sample cost grows past the plateau.
struct ProbeResult {
  int64_t fixed_bytes = 0;       // large-batch line at b = 0: model states, buckets, runtime
  int64_t per_sample_bytes = 0;  // added per sample of the micro-batch: activations, inputs, scratch
  int64_t small_fixed_bytes = 0;
  int64_t small_per_sample_bytes = 0;
  int64_t model_state_bytes = 0;  // parameters and buffers
  // The smallest and largest micro-batch measured (for the plan's explanation) and the peaks of
  // the last probe run's two batches.
  int64_t small_batch = 0;
  int64_t large_batch = 0;
  int64_t small_peak_bytes = 0;
  int64_t large_peak_bytes = 0;
};

// Measures a spec's memory by running it. Blocking (seconds); implementations are thread-safe.
class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;
  virtual absl::StatusOr<ProbeResult> Probe(const fitrun::v1::JobSpec& spec) = 0;
};

// What a probe result depends on: the model (builtin and its config, or the TorchScript file and its
// modification time), the dataset where it sizes the model (SASRec's item count), the optimizer's
// state (kind, momentum, weight decay) and the precision. Not the batch, devices or steps.
std::string CalibrationKey(const fitrun::v1::JobSpec& spec);

// The analytic profile with the probe's line in place of its memory figures: calibrated_fixed_bytes
// = fixed, activation_bytes_per_sample = per_sample (input bytes are inside it), parameter_count
// from the measured model state.
ModelProfile CalibratedProfile(ModelProfile analytic, const ProbeResult& probe);

// Thread-safe. Probes run on the caller's thread (Calibrate) or on a thread of the calibrator's own
// (StartCalibration), never under the lock, so lookups never wait for a probe. The destructor joins
// the background probes.
class MemoryCalibrator {
 public:
  struct Options {
    // A file of cached results (lines "key<TAB>fixed<TAB>per_sample<TAB>model_state<TAB>smallest
    // batch<TAB>largest batch<TAB>small_fixed<TAB>small_per_sample"),
    // read at Create and appended to after each probe; empty: memory only.
    std::string cache_path;
  };
  // Reads the cache file if it exists. `probe` must outlive the calibrator.
  static absl::StatusOr<std::unique_ptr<MemoryCalibrator>> Create(Options options, MemoryProbe* probe);
  ~MemoryCalibrator();
  MemoryCalibrator(const MemoryCalibrator&) = delete;
  MemoryCalibrator& operator=(const MemoryCalibrator&) = delete;

  // The cached result, or probes now and caches it (a probe already running for the same key is
  // waited for, not repeated). A failed probe is remembered and returned again without re-probing.
  absl::StatusOr<ProbeResult> Calibrate(const fitrun::v1::JobSpec& spec);

  enum class State { kMissing, kMeasuring, kReady, kFailed };
  struct Lookup {
    State state = State::kMissing;
    ProbeResult result;  // kReady
    absl::Status error;  // kFailed
  };
  // Never blocks on a probe.
  Lookup Find(const fitrun::v1::JobSpec& spec);
  // Starts probing the spec on a background thread unless its key is cached or being measured
  // (then returns false); `on_done` runs on that thread when the result (or failure) is cached,
  // with no lock of the calibrator's held.
  bool StartCalibration(const fitrun::v1::JobSpec& spec, std::function<void()> on_done);

  // The spec's profile for planning: analytic, calibrated when the cache has the spec's line; with
  // `probe_if_missing` the probe runs now (blocking). A failed probe falls back to the analytic
  // profile and says so in memory_source.
  absl::StatusOr<ModelProfile> ProfileFor(const fitrun::v1::JobSpec& spec, bool probe_if_missing);

  int64_t probes_run();

 private:
  MemoryCalibrator(Options options, MemoryProbe* probe) : options_(std::move(options)), probe_(probe) {}
  absl::Status LoadCache();
  void Store(const std::string& key, const absl::StatusOr<ProbeResult>& result);

  const Options options_;
  MemoryProbe* const probe_;
  absl::Mutex mu_;
  std::map<std::string, absl::StatusOr<ProbeResult>> done_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> measuring_ ABSL_GUARDED_BY(mu_);
  int64_t probes_run_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// Lets a callback handed to another thread (StartCalibration's on_done) call back into an object
// that may be destroyed first: wrapped callbacks do nothing once the guard is gone, and the guard's
// destructor waits for one that is running. Declare it as the owner's last member.
class CallbackGuard {
 public:
  CallbackGuard() : state_(std::make_shared<State>()) {}
  ~CallbackGuard() {
    absl::MutexLock lock(&state_->mu);
    state_->alive = false;
  }
  CallbackGuard(const CallbackGuard&) = delete;
  CallbackGuard& operator=(const CallbackGuard&) = delete;

  std::function<void()> Wrap(std::function<void()> callback) const {
    return [state = state_, callback = std::move(callback)] {
      absl::MutexLock lock(&state->mu);
      if (state->alive) callback();
    };
  }

 private:
  struct State {
    absl::Mutex mu;
    bool alive = true;
  };
  const std::shared_ptr<State> state_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_CALIBRATION_H_
