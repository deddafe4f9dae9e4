// Calibrated memory estimates: one rank's peak memory measured by running the model, kept per
// workload and corrected by what real runs report.
//
// The analytic profiles (model_profile.h) are upper bounds, tens to hundreds of percent high. A
// probe (fitrun-worker --probe: real forward/backward/optimizer steps under the worker's counting
// allocator, one process per sweep) measures the peak at the micro-batches a sweep chooses
// (memory_curve.h). MemoryCalibrator runs those sweeps, and single measurements at batches plans are
// about to use, on threads of its own, never on a caller's: a lookup never waits for a probe. It
// caches the results by what changes memory (CalibrationKey) in memory and in a file, so a
// restarted coordinator does not probe again, learns from the peaks that real runs of the workload
// report, and turns all of it into the calibrated ModelProfile the estimator and the planner use.
#ifndef FITRUN_SERVER_CORE_CALIBRATION_MEMORY_CALIBRATION_H_
#define FITRUN_SERVER_CORE_CALIBRATION_MEMORY_CALIBRATION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/calibration/calibrated_profile.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/memory/memory_curve.h"
#include "server/core/memory/model_profile.h"

namespace fitrun::server {

// One running probe of one spec: the model built and its data loaded, ready to measure. Blocking
// calls (seconds); used by one thread at a time.
class MemoryProbeSession {
 public:
  virtual ~MemoryProbeSession() = default;
  // Parameters and buffers as the probe's allocator counted them.
  virtual int64_t model_state_bytes() const = 0;
  // The largest micro-batch it can measure: the training split's size.
  virtual int64_t train_samples() const = 0;
  // The peak of real training steps at `batch`; RESOURCE_EXHAUSTED when the steps need more than the
  // session's byte budget (the probe enforces it), any other error when the probe failed.
  virtual absl::StatusOr<int64_t> MeasurePeak(int64_t batch) = 0;
  // The wall time of the last measurement's last step (its allocations warm); 0 where not timed.
  // The probe runs niced, so it is a rank's step time only while the cores are otherwise idle.
  virtual double last_step_seconds() const { return 0; }
};

// Starts probe sessions (a child process in fitrund: server/probe/process_memory_probe.h).
// Implementations are thread-safe.
class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;
  // Loads `spec`'s workload for measuring, with no measurement allowed past `max_bytes`, as the
  // Unix account `run_as` ("": fitrund's own user). Errors name the spec field when the spec
  // cannot be probed.
  virtual absl::StatusOr<std::unique_ptr<MemoryProbeSession>> Start(const fitrun::v1::JobSpec& spec,
                                                                     int64_t max_bytes, const std::string& run_as) = 0;
};

// What a calibration depends on: the model (builtin and its config, or the TorchScript file and its
// modification time), the dataset where it sizes the model (SASRec's item count), the optimizer's
// state (kind, momentum, weight decay) and the precision; for a script, its command, directory,
// environment and the script file's version. Not the batch, devices or steps. And whose processes
// measured it: `run_as`, the Unix account a job's probes and ranks run as ("": fitrund's own user).
// Every figure comes from processes that account controls (a script can print any peak; a rank's
// report is its word), so it calibrates that account's plans and no other's. The workload is named
// by the SHA-256 of all that (a script's part alone may be 64 KiB of spec, and its environment is
// the user's), the account in the clear: "v5 <hex>[ | account <run_as>]".
std::string CalibrationKey(const fitrun::v1::JobSpec& spec, const std::string& run_as);
// The account a key's figures are from ("" for fitrund's own user).
std::string AccountOfCalibrationKey(const std::string& key);




// Thread-safe. Probes run on the calibrator's own threads, one workload at a time per thread and
// never two of the same workload at once; callbacks run on those threads with no lock of the
// calibrator's held. The destructor waits for the probe running, drops the queued ones.
class MemoryCalibrator {
 public:
  struct Options {
    // Where calibrations persist (an append-only file of sweeps, single measurements and runs, see
    // memory_calibration.cc); empty: memory only.
    std::string cache_path;
    // No probe measurement may peak above this, whatever the devices (the host runs the probes).
    int64_t max_probe_bytes = int64_t{4} << 30;
    // The sweep's tolerance (memory_curve.h), and how far runs may differ from the curve before
    // they correct it (the estimator's calibrated margin covers smaller differences).
    double tolerance = 0.04;
    double run_tolerance = 0.03;
    // Run peaks kept per workload.
    int runs_kept = 16;
    // Probes measuring at once (of different workloads).
    int threads = 1;
    // What one account's jobs and plans may hold of the calibrator: probes queued at once (a
    // workload asked past it waits, unmeasured, and is asked again by the next scheduling pass),
    // and workloads kept (its least recently measured one is forgotten past it).
    int max_queued_per_account = 4;
    int max_workloads_per_account = 256;
    // Told how long each probe ran; nullptr: nobody.
    CoordinatorMetrics* metrics = nullptr;
  };
  // Reads the cache file if it exists. `probe` must outlive the calibrator.
  static absl::StatusOr<std::unique_ptr<MemoryCalibrator>> Create(Options options, MemoryProbe* probe);
  ~MemoryCalibrator();
  MemoryCalibrator(const MemoryCalibrator&) = delete;
  MemoryCalibrator& operator=(const MemoryCalibrator&) = delete;

  enum class State { kMissing, kMeasuring, kReady, kFailed };
  struct Lookup {
    State state = State::kMissing;
    Calibration calibration;  // kReady
    absl::Status error;       // kFailed
    // kFailed because micro-batch 1 needed more than the probe's budget: that budget (0 otherwise).
    int64_t batch_one_over_bytes = 0;
  };
  // Never blocks on a probe. `run_as` everywhere below: whose calibration (CalibrationKey), and the
  // Unix account probes run as.
  Lookup Find(const fitrun::v1::JobSpec& spec, const std::string& run_as);

  // Queues a sweep of the spec's workload unless it is calibrated or queued already (then returns
  // false), measuring micro-batches up to `max_batch` (the most a rank of the asking job takes) and
  // peaks up to `max_bytes` (its roomiest device). `on_done` runs when the result is in.
  bool StartCalibration(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t max_batch,
                        int64_t max_bytes, std::function<void()> on_done);
  // Queues one measurement at `batch` of a calibrated workload (a plan's batch beyond the measured
  // ones, or a tight one); the peak joins the curve, or, past `max_bytes`, a point just above it
  // does. False when that batch is measured or queued already, or the workload is not calibrated.
  bool StartMeasurement(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t batch, int64_t max_bytes,
                        std::function<void()> on_done);
  // Whether a measurement of `batch` for the spec's workload is queued or running.
  bool Measuring(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t batch);
  // What a real run measured: the largest peak of an attempt's ranks at its per-device batch. Runs
  // of a workload not swept yet (one that launched on its analytic estimate) are kept for its sweep,
  // whose curve they then correct like any later run; a script's runs are its calibration until then
  // (Find says kReady, with CalibrationFromRuns).
  void RecordRun(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t batch, int64_t peak_bytes);

  // Sweeps now on the caller's thread (or returns the cached calibration): for benchmarks and tools.
  absl::StatusOr<Calibration> CalibrateNow(const fitrun::v1::JobSpec& spec, const SweepLimits& limits,
                                           const std::string& run_as = "");

  // The spec's profile for planning: analytic, calibrated when its workload is (for `run_as`).
  // Never probes.
  absl::StatusOr<ModelProfile> ProfileFor(const fitrun::v1::JobSpec& spec, const std::string& run_as);

  // Probe sessions started so far (sweeps and single measurements).
  int64_t probes_run();

 private:
  struct Task {
    std::string key;
    fitrun::v1::JobSpec spec;
    int64_t batch = 0;  // 0: a sweep; otherwise a single measurement
    SweepLimits limits;
    std::function<void()> on_done;
    std::string run_as;
  };
  MemoryCalibrator(Options options, MemoryProbe* probe) : options_(std::move(options)), probe_(probe) {}
  absl::Status LoadCache();
  void Loop();
  absl::StatusOr<Calibration> Sweep(const Task& task);
  absl::StatusOr<MeasuredPeak> MeasureOne(const Task& task);
  // Stores a sweep's result (with the runs that came before it) and returns what was stored.
  absl::StatusOr<Calibration> StoreSweep(const std::string& key, const absl::StatusOr<Calibration>& result);
  // Appends lines to the cache file; rewrites it whole (atomically) when it has grown well past
  // what it describes.
  void AppendToCache(const std::string& lines) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RewriteCache() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends a run's peak to `runs`, keeping the newest options_.runs_kept.
  void KeepRun(std::vector<MeasuredPeak>& runs, const MeasuredPeak& run) const;
  bool CacheOverGrown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the account has options_.max_queued_per_account probes queued.
  bool QueueFullFor(const std::string& run_as) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `key` among its account's workloads, forgetting the account's oldest past
  // options_.max_workloads_per_account (never one queued or being measured).
  void KeepWorkload(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetWorkload(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  MemoryProbe* const probe_;
  absl::Mutex mu_;
  std::map<std::string, absl::StatusOr<Calibration>> done_ ABSL_GUARDED_BY(mu_);
  // Real runs of workloads with no sweep yet, by key: they join the calibration when one is made.
  std::map<std::string, std::vector<MeasuredPeak>> runs_before_sweep_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> sweeping_ ABSL_GUARDED_BY(mu_);                       // queued or running
  std::set<std::pair<std::string, int64_t>> measuring_ ABSL_GUARDED_BY(mu_);  // queued or running
  std::set<std::pair<std::string, int64_t>> failed_measurements_ ABSL_GUARDED_BY(mu_);
  // Sweeps that found micro-batch 1 over their budget, by key: the budget (in memory, as failures).
  std::map<std::string, int64_t> batch_one_over_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> busy_ ABSL_GUARDED_BY(mu_);  // a task of the workload runs
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  // Each account's workloads (done_ and runs_before_sweep_ keys), oldest first.
  std::map<std::string, std::deque<std::string>> workloads_by_account_ ABSL_GUARDED_BY(mu_);
  int64_t probes_run_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cache_lines_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
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

#endif  // FITRUN_SERVER_CORE_CALIBRATION_MEMORY_CALIBRATION_H_
