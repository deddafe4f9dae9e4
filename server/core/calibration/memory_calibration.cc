#include "server/core/calibration/memory_calibration.h"
#include "server/core/specs/workloads.h"

#include "proto/contract/atomic_file.h"
#include "proto/contract/log.h"
#include "server/core/specs/job_specs.h"
#include "server/core/units.h"
#include "server/core/digest.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

// The cache file holds one record per line, tab-separated, replayed in order at start:
//   sweep <key> <model state bytes> <batch:peak,batch:peak,...> <why the sweep stopped where it did>
//   point <key> <batch> <peak>          a single measurement added to the key's curve
//   run   <key> <batch> <peak>          a real run's largest rank peak
//   times <key> <batch>:<seconds>,...   the sweep's step times (after its sweep line)
// A later sweep of a key replaces its points. A torn last line (a crash while appending) is skipped.
constexpr char kSweep[] = "sweep";
constexpr char kPoint[] = "point";
constexpr char kRun[] = "run";
constexpr char kStepTimes[] = "times";

// Tabs and newlines are the file's separators.
std::string OneField(std::string text) {
  for (char& c : text) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string PointsField(const MemoryCurve& curve) {
  std::vector<std::string> points;
  for (const MeasuredPeak& p : curve.points()) points.push_back(absl::StrCat(p.batch, ":", p.peak_bytes));
  return absl::StrJoin(points, ",");
}

bool ParseNumber(absl::string_view text, int64_t* value) { return absl::SimpleAtoi(text, value); }
bool ParseNumber(absl::string_view text, double* value) { return absl::SimpleAtod(text, value); }

// "<batch>:<value>,..." into (batch, value) records: a curve's peaks, a sweep's step times.
template <typename Record, typename Value>
bool ParseBatchPairs(absl::string_view field, Value Record::*value, std::vector<Record>* records) {
  for (absl::string_view pair : absl::StrSplit(field, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(pair, ':');
    Record r;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.batch) || !ParseNumber(parts[1], &(r.*value))) return false;
    records->push_back(r);
  }
  return !records->empty();
}

bool ParsePoints(absl::string_view field, std::vector<MeasuredPeak>* points) {
  return ParseBatchPairs(field, &MeasuredPeak::peak_bytes, points);
}

// The sweep's line, and its step times' when it has them.
std::string SweepLine(const std::string& key, const Calibration& c) {
  std::string lines = absl::StrCat(kSweep, "\t", key, "\t", c.model_state_bytes, "\t", PointsField(c.measured), "\t",
                                   OneField(c.sweep_note), "\n");
  if (!c.step_times.empty()) {
    std::vector<std::string> times;
    for (const MeasuredStepTime& t : c.step_times) times.push_back(absl::StrFormat("%d:%.6f", t.batch, t.seconds));
    absl::StrAppend(&lines, kStepTimes, "\t", key, "\t", absl::StrJoin(times, ","), "\n");
  }
  return lines;
}

bool ParseStepTimes(absl::string_view field, std::vector<MeasuredStepTime>* times) {
  return ParseBatchPairs(field, &MeasuredStepTime::seconds, times);
}

std::string PairLine(const char* kind, const std::string& key, const MeasuredPeak& p) {
  return absl::StrCat(kind, "\t", key, "\t", p.batch, "\t", p.peak_bytes, "\n");
}

}  // namespace

// The workload alone, whoever measured it.
static std::string WorkloadCalibrationKey(const fitrun::v1::JobSpec& spec) {
  // "v4": sweeps that measure to within 4x of the largest batch a plan can take; the sweeps of
  // earlier versions, which could stop far below it, are not reused.
  std::string key = "v4 ";
  if (spec.has_script()) {
    // The script's text and everything it is told, but not the plan: a changed script is measured again.
    // Recomputing activations is a workload of its own; false is the plain script, as unset is.
    fitrun::v1::ScriptSpec script = spec.script();
    if (script.has_activation_checkpointing() && !script.activation_checkpointing()) {
      script.clear_activation_checkpointing();
    }
    absl::StrAppend(&key, "script ", script.ShortDebugString());
    // The precision it is told to autocast to (FITRUN_PRECISION), where not the default.
    if (spec.precision() != fitrun::v1::PRECISION_UNSPECIFIED && spec.precision() != fitrun::v1::PRECISION_FP32) {
      absl::StrAppend(&key, " ", fitrun::v1::Precision_Name(spec.precision()));
    }
    if (std::optional<int> file = ScriptFileIndex(script); file.has_value()) {
      absl::StrAppend(&key, " file ",
                      RecordedVersion(spec, (std::filesystem::path(script.working_dir()) / script.command(*file)).string()));
    }
    return OneField(key);
  }
  absl::StrAppend(&key, WorkloadMemoryKey(spec));
  const fitrun::v1::OptimizerSpec& optimizer = spec.optimizer();
  absl::StrAppend(&key, " | optimizer ", fitrun::v1::OptimizerKind_Name(optimizer.kind()),
                  optimizer.momentum() > 0 ? " momentum" : "", optimizer.weight_decay() > 0 ? " weight_decay" : "",
                  " | ",
                  fitrun::v1::Precision_Name(spec.precision() == fitrun::v1::PRECISION_UNSPECIFIED
                                                 ? fitrun::v1::PRECISION_FP32
                                                 : spec.precision()));
  return OneField(key);
}

// What a hashed key starts with; a cache line of any other key is of an older fitrund.
constexpr char kHashedKeyPrefix[] = "v5 ";
constexpr char kAccountInKey[] = " | account ";

std::string CalibrationKey(const fitrun::v1::JobSpec& spec, const std::string& run_as) {
  std::string key = absl::StrCat(kHashedKeyPrefix, Sha256Hex(WorkloadCalibrationKey(spec)));
  if (!run_as.empty()) absl::StrAppend(&key, kAccountInKey, run_as);
  return OneField(key);
}

std::string AccountOfCalibrationKey(const std::string& key) {
  const size_t at = key.find(kAccountInKey);
  return at == std::string::npos ? "" : key.substr(at + std::strlen(kAccountInKey));
}

absl::StatusOr<std::unique_ptr<MemoryCalibrator>> MemoryCalibrator::Create(Options options, MemoryProbe* probe) {
  if (probe == nullptr) return absl::InvalidArgumentError("memory calibrator: no probe");
  if (options.threads < 1) return absl::InvalidArgumentError("memory calibrator: threads must be >= 1");
  std::unique_ptr<MemoryCalibrator> calibrator(new MemoryCalibrator(std::move(options), probe));
  if (absl::Status status = calibrator->LoadCache(); !status.ok()) return status;
  for (int i = 0; i < calibrator->options_.threads; ++i) {
    calibrator->threads_.emplace_back([c = calibrator.get()] { c->Loop(); });
  }
  return calibrator;
}

MemoryCalibrator::~MemoryCalibrator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status MemoryCalibrator::LoadCache() {
  if (options_.cache_path.empty()) return absl::OkStatus();
  std::ifstream in(options_.cache_path);
  if (!in) return absl::OkStatus();  // nothing measured yet
  absl::MutexLock lock(&mu_);
  std::string line;
  while (std::getline(in, line)) {
    ++cache_lines_;
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    if (fields.size() < 2 || !absl::StartsWith(fields[1], kHashedKeyPrefix)) continue;  // an older fitrund's key
    KeepWorkload(fields[1]);
    if (fields.size() == 5 && fields[0] == kSweep) {
      Calibration c;
      std::vector<MeasuredPeak> points;
      if (!absl::SimpleAtoi(fields[2], &c.model_state_bytes) || !ParsePoints(fields[3], &points)) continue;
      c.measured = MemoryCurve(std::move(points));
      c.sweep_note = fields[4];
      if (auto it = done_.find(fields[1]); it != done_.end() && it->second.ok()) c.runs = it->second->runs;
      if (auto before = runs_before_sweep_.extract(fields[1])) {
        for (const MeasuredPeak& run : before.mapped()) KeepRun(c.runs, run);
      }
      done_.insert_or_assign(fields[1], std::move(c));
      continue;
    }
    if (fields.size() == 3 && fields[0] == kStepTimes) {
      std::vector<MeasuredStepTime> times;
      auto it = done_.find(fields[1]);
      if (it != done_.end() && it->second.ok() && ParseStepTimes(fields[2], &times)) it->second->step_times = times;
      continue;
    }
    MeasuredPeak p;
    if (fields.size() != 4 || !absl::SimpleAtoi(fields[2], &p.batch) || !absl::SimpleAtoi(fields[3], &p.peak_bytes)) {
      continue;  // a torn line, or a record of an older version
    }
    auto it = done_.find(fields[1]);
    const bool swept = it != done_.end() && it->second.ok();
    if (fields[0] == kPoint && swept) it->second->measured = it->second->measured.WithPoint(p);
    if (fields[0] == kRun) KeepRun(swept ? it->second->runs : runs_before_sweep_[fields[1]], p);
  }
  if (CacheOverGrown()) RewriteCache();
  return absl::OkStatus();
}

void MemoryCalibrator::AppendToCache(const std::string& lines) {
  if (options_.cache_path.empty()) return;
  std::ofstream out(options_.cache_path, std::ios::app);
  out << lines;
  cache_lines_ += std::count(lines.begin(), lines.end(), '\n');
  if (CacheOverGrown()) RewriteCache();
}

bool MemoryCalibrator::CacheOverGrown() const {
  const int64_t workloads = static_cast<int64_t>(done_.size() + runs_before_sweep_.size());
  return cache_lines_ > 2 * workloads * (options_.runs_kept + 2) + 64;
}

void MemoryCalibrator::KeepRun(std::vector<MeasuredPeak>& runs, const MeasuredPeak& run) const {
  runs.push_back(run);
  if (static_cast<int>(runs.size()) > options_.runs_kept) runs.erase(runs.begin());
}

void MemoryCalibrator::RewriteCache() {
  std::string text;
  int64_t lines = 0;
  for (const auto& [key, result] : done_) {
    if (!result.ok()) continue;
    absl::StrAppend(&text, SweepLine(key, *result));
    ++lines;
    for (const MeasuredPeak& run : result->runs) {
      absl::StrAppend(&text, PairLine(kRun, key, run));
      ++lines;
    }
  }
  for (const auto& [key, runs] : runs_before_sweep_) {
    for (const MeasuredPeak& run : runs) {
      absl::StrAppend(&text, PairLine(kRun, key, run));
      ++lines;
    }
  }
  // A crash leaves the old file or the new one whole.
  if (!contract::WriteFileAtomically(options_.cache_path, text).ok()) return;
  cache_lines_ = lines;
}

bool MemoryCalibrator::QueueFullFor(const std::string& run_as) const {
  int queued = 0;
  for (const Task& task : queue_) queued += task.run_as == run_as ? 1 : 0;
  return queued >= options_.max_queued_per_account;
}

void MemoryCalibrator::KeepWorkload(const std::string& key) {
  std::deque<std::string>& keys = workloads_by_account_[AccountOfCalibrationKey(key)];
  if (std::find(keys.begin(), keys.end(), key) != keys.end()) return;
  keys.push_back(key);
  for (auto it = keys.begin(); static_cast<int>(keys.size()) > options_.max_workloads_per_account && it != keys.end();) {
    const auto measuring = measuring_.lower_bound({*it, std::numeric_limits<int64_t>::min()});
    if (sweeping_.count(*it) > 0 || busy_.count(*it) > 0 || (measuring != measuring_.end() && measuring->first == *it)) {
      ++it;
      continue;
    }
    ForgetWorkload(*it);
    it = keys.erase(it);
  }
}

void MemoryCalibrator::ForgetWorkload(const std::string& key) {
  done_.erase(key);
  runs_before_sweep_.erase(key);
  batch_one_over_.erase(key);
  failed_measurements_.erase(failed_measurements_.lower_bound({key, std::numeric_limits<int64_t>::min()}),
                             failed_measurements_.upper_bound({key, std::numeric_limits<int64_t>::max()}));
}

MemoryCalibrator::Lookup MemoryCalibrator::Find(const fitrun::v1::JobSpec& spec, const std::string& run_as) {
  const std::string key = CalibrationKey(spec, run_as);
  absl::MutexLock lock(&mu_);
  Lookup lookup;
  if (auto it = done_.find(key); it != done_.end()) {
    if (it->second.ok()) {
      lookup.state = State::kReady;
      lookup.calibration = *it->second;
    } else {
      lookup.state = State::kFailed;
      lookup.error = it->second.status();
      if (auto over = batch_one_over_.find(key); over != batch_one_over_.end()) lookup.batch_one_over_bytes = over->second;
    }
  } else if (sweeping_.count(key) > 0) {
    lookup.state = State::kMeasuring;
  } else if (auto runs = runs_before_sweep_.find(key); spec.has_script() && runs != runs_before_sweep_.end()) {
    // A script's own runs are its measurements: each is a point of its curve at the batch it ran.
    lookup.state = State::kReady;
    lookup.calibration = CalibrationFromRuns(runs->second);
  }
  return lookup;
}

bool MemoryCalibrator::StartCalibration(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t max_batch,
                                        int64_t max_bytes, std::function<void()> on_done) {
  const std::string key = CalibrationKey(spec, run_as);
  absl::MutexLock lock(&mu_);
  if (stopping_ || done_.count(key) > 0 || sweeping_.count(key) > 0 || QueueFullFor(run_as)) return false;
  sweeping_.insert(key);
  Task task{key, spec, 0, SweepLimits{}, std::move(on_done), run_as};
  task.limits.max_batch = std::max<int64_t>(1, max_batch);
  task.limits.max_bytes = std::min(max_bytes > 0 ? max_bytes : options_.max_probe_bytes, options_.max_probe_bytes);
  task.limits.tolerance = options_.tolerance;
  queue_.push_back(std::move(task));
  return true;
}

bool MemoryCalibrator::StartMeasurement(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t batch,
                                        int64_t max_bytes, std::function<void()> on_done) {
  const std::string key = CalibrationKey(spec, run_as);
  absl::MutexLock lock(&mu_);
  auto it = done_.find(key);
  if (stopping_ || batch < 1 || it == done_.end() || !it->second.ok() || it->second->measured.Measured(batch) ||
      measuring_.count({key, batch}) > 0 || failed_measurements_.count({key, batch}) > 0 || QueueFullFor(run_as)) {
    return false;
  }
  measuring_.insert({key, batch});
  Task task{key, spec, batch, SweepLimits{}, std::move(on_done), run_as};
  task.limits.max_bytes = std::min(max_bytes > 0 ? max_bytes : options_.max_probe_bytes, options_.max_probe_bytes);
  queue_.push_back(std::move(task));
  return true;
}

bool MemoryCalibrator::Measuring(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t batch) {
  const std::string key = CalibrationKey(spec, run_as);
  absl::MutexLock lock(&mu_);
  return measuring_.count({key, batch}) > 0;
}

void MemoryCalibrator::RecordRun(const fitrun::v1::JobSpec& spec, const std::string& run_as, int64_t batch,
                                 int64_t peak_bytes) {
  if (batch < 1 || peak_bytes <= 0) return;
  const std::string key = CalibrationKey(spec, run_as);
  absl::MutexLock lock(&mu_);
  auto it = done_.find(key);
  const bool swept = it != done_.end() && it->second.ok();
  KeepRun(swept ? it->second->runs : runs_before_sweep_[key], {batch, peak_bytes});
  KeepWorkload(key);
  AppendToCache(PairLine(kRun, key, {batch, peak_bytes}));
}

void MemoryCalibrator::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    // The oldest task whose workload no other thread is probing.
    auto runnable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stopping_) return true;
      for (const Task& task : queue_) {
        if (busy_.count(task.key) == 0) return true;
      }
      return false;
    };
    mu_.Await(absl::Condition(&runnable));
    if (stopping_) return;
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [this](const Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return busy_.count(t.key) == 0; });
    Task task = std::move(*it);
    queue_.erase(it);
    busy_.insert(task.key);
    ++probes_run_;
    mu_.Unlock();
    const absl::Time started = absl::Now();
    if (task.batch == 0) {
      // Kept for the waiting plans (and any error with it); the loop itself needs nothing back.
      (void)StoreSweep(task.key, Sweep(task));
    } else {
      absl::StatusOr<MeasuredPeak> point = MeasureOne(task);
      absl::MutexLock done(&mu_);
      measuring_.erase({task.key, task.batch});
      if (point.ok()) {
        auto calibrated = done_.find(task.key);
        if (calibrated != done_.end() && calibrated->second.ok()) {
          MemoryCurve& curve = calibrated->second->measured;
          // Past the probe's budget (MeasureOne) is a lower bound, and that budget may be below the
          // device's memory: the bound must not pull an extrapolation above it down to it.
          curve = point->peak_bytes > task.limits.max_bytes ? curve.WithLowerBound(*point) : curve.WithPoint(*point);
          AppendToCache(PairLine(kPoint, task.key, {point->batch, curve.PeakAt(point->batch)}));
        }
      } else {
        // Remembered so the plan goes ahead without it instead of asking again and again.
        failed_measurements_.insert({task.key, task.batch});
        // The log keeps it on one line: the message quotes the probe's output, which is the job's
        // code's, and must not pass for lines of fitrund's own.
        contract::LogWarning("measuring micro-batch %d of %s failed: %s", task.batch, task.key,
                             point.status().message());
      }
    }
    if (options_.metrics != nullptr) options_.metrics->MemoryProbeRan(absl::Now() - started);
    if (task.on_done) task.on_done();
    mu_.Lock();
    busy_.erase(task.key);
  }
}

absl::StatusOr<Calibration> MemoryCalibrator::Sweep(const Task& task) {
  const SweepLimits& limits = task.limits;
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe_->Start(task.spec, limits.max_bytes, task.run_as);
  if (!session.ok()) return session.status();
  Calibration c;
  c.model_state_bytes = (*session)->model_state_bytes();
  SweepLimits bounded = limits;
  // 0 training samples: a script, whose dataset the probe cannot see.
  if ((*session)->train_samples() > 0) bounded.max_batch = std::min(bounded.max_batch, (*session)->train_samples());
  // A script's every measurement starts it again.
  bounded.costly_points = task.spec.has_script();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::CancelledError("the coordinator is shutting down");
    }
    const SweepStep step = NextSweepBatch(c.measured, bounded);
    if (step.next_batch == 0) {
      c.sweep_note = step.done_reason;
      break;
    }
    absl::StatusOr<int64_t> peak = (*session)->MeasurePeak(step.next_batch);
    if (absl::IsResourceExhausted(peak.status())) {
      bounded.over_budget_batch = step.next_batch;
      continue;
    }
    if (!peak.ok()) return peak.status();
    c.measured = c.measured.WithPoint({step.next_batch, *peak});
    if (const double seconds = (*session)->last_step_seconds(); seconds > 0) {
      c.step_times.push_back({step.next_batch, seconds});
    }
  }
  if (c.measured.empty()) {
    if (bounded.over_budget_batch == 1) {
      absl::MutexLock lock(&mu_);
      batch_one_over_[task.key] = limits.max_bytes;
    }
    return absl::ResourceExhaustedError(absl::StrCat("memory probe: ", c.sweep_note));
  }
  return c;
}

absl::StatusOr<MeasuredPeak> MemoryCalibrator::MeasureOne(const Task& task) {
  const int64_t batch = task.batch;
  const int64_t max_bytes = task.limits.max_bytes;
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe_->Start(task.spec, max_bytes, task.run_as);
  if (!session.ok()) return session.status();
  absl::StatusOr<int64_t> peak = (*session)->MeasurePeak(batch);
  // More than the budget (the device) is all a plan needs to know: it does not fit.
  if (absl::IsResourceExhausted(peak.status())) return MeasuredPeak{batch, max_bytes + 1};
  if (!peak.ok()) return peak.status();
  return MeasuredPeak{batch, *peak};
}

absl::StatusOr<Calibration> MemoryCalibrator::StoreSweep(const std::string& key,
                                                         const absl::StatusOr<Calibration>& result) {
  absl::MutexLock lock(&mu_);
  // Failures stay in memory only: a restarted coordinator tries again (the binary may be fixed).
  absl::StatusOr<Calibration>& stored = done_.insert_or_assign(key, result).first->second;
  sweeping_.erase(key);
  KeepWorkload(key);
  if (!stored.ok()) {
    contract::LogError("measuring %s failed: %s", key, stored.status().message());
    return stored;
  }
  if (auto before = runs_before_sweep_.extract(key)) {
    for (const MeasuredPeak& run : before.mapped()) KeepRun(stored->runs, run);
  }
  // The runs' lines are in the file already, before this sweep's: loading puts them back the same way.
  AppendToCache(SweepLine(key, *stored));
  return stored;
}

absl::StatusOr<Calibration> MemoryCalibrator::CalibrateNow(const fitrun::v1::JobSpec& spec, const SweepLimits& limits,
                                                           const std::string& run_as) {
  const std::string key = CalibrationKey(spec, run_as);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = done_.find(key); it != done_.end()) return it->second;
    ++probes_run_;
  }
  Task task{key, spec, 0, limits, nullptr, run_as};
  return StoreSweep(key, Sweep(task));
}

absl::StatusOr<ModelProfile> MemoryCalibrator::ProfileFor(const fitrun::v1::JobSpec& spec, const std::string& run_as) {
  absl::StatusOr<ModelProfile> analytic = fitrun::server::ProfileFor(spec);
  if (!analytic.ok()) return analytic.status();
  const Lookup lookup = Find(spec, run_as);
  if (lookup.state == State::kReady) {
    ModelProfile calibrated = CalibratedProfile(*std::move(analytic), lookup.calibration, options_.run_tolerance);
    calibrated.memory_unmeasured = false;
    if (spec.has_script() && !lookup.calibration.from_runs_only) {
      calibrated.batch_not_plannable = BatchIgnoredBy(lookup.calibration.measured);
    }
    return calibrated;
  }
  if (lookup.state == State::kFailed && spec.has_script() && lookup.batch_one_over_bytes > 0) {
    // Measured after all: the script needs more than the budget even at micro-batch 1, so no batch of
    // it fits a device that size (another strategy's may).
    analytic->measured = MemoryCurve({{1, lookup.batch_one_over_bytes + 1}});
    analytic->memory_source = absl::StrCat("measured: fitrun-worker --probe found micro-batch 1 above its budget of ",
                                           FormatBytes(lookup.batch_one_over_bytes), " (the roomiest device)");
    return analytic;
  }
  if (lookup.state == State::kFailed) {
    analytic->memory_source = absl::StrCat(analytic->memory_source, " (the memory probe failed: ",
                                           lookup.error.message(), ")");
    if (spec.has_script()) {
      analytic->batch_not_plannable = absl::StrCat(
          "spec.script: the memory probe could not run the script (", lookup.error.message(),
          "), so fitrun cannot choose its per-device batch; fix the script, or fix spec.resources.per_device_batch");
    }
  }
  return analytic;
}

int64_t MemoryCalibrator::probes_run() {
  absl::MutexLock lock(&mu_);
  return probes_run_;
}

}  // namespace fitrun::server
