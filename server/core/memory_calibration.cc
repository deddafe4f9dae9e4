#include "server/core/memory_calibration.h"

#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/core/planner.h"

namespace fitrun::server {
namespace {

// "<path>@<mtime ns>:<size>", or "<path>@missing": a rewritten file is a new model.
std::string FileVersion(const std::string& path) {
  std::error_code error;
  const auto mtime = std::filesystem::last_write_time(path, error);
  if (error) return absl::StrCat(path, "@missing");
  const auto size = std::filesystem::file_size(path, error);
  return absl::StrCat(path, "@", mtime.time_since_epoch().count(), ":", error ? 0 : static_cast<int64_t>(size));
}

}  // namespace

std::string CalibrationKey(const fitrun::v1::JobSpec& spec) {
  const fitrun::v1::ModelSpec& model = spec.model();
  // "v2": results of probes that measure small and large batches; older lines are not reused.
  std::string key = "v2 ";
  if (model.kind_case() == fitrun::v1::ModelSpec::kTorchscript) {
    absl::StrAppend(&key, "torchscript ", FileVersion(model.torchscript()));
  } else if (model.builtin() == "gpt") {
    absl::StrAppend(&key, "gpt ", model.gpt().ShortDebugString());
  } else if (model.builtin() == "sasrec") {
    // The item count, read from the ratings file, sizes the embedding.
    absl::StrAppend(&key, "sasrec ", model.sasrec().ShortDebugString(), " data ", FileVersion(spec.data().path()));
  } else {
    absl::StrAppend(&key, model.builtin());
  }
  const fitrun::v1::OptimizerSpec& optimizer = spec.optimizer();
  absl::StrAppend(&key, " | optimizer ", fitrun::v1::OptimizerKind_Name(optimizer.kind()),
                  optimizer.momentum() > 0 ? " momentum" : "", optimizer.weight_decay() > 0 ? " weight_decay" : "",
                  " | ",
                  fitrun::v1::Precision_Name(spec.precision() == fitrun::v1::PRECISION_UNSPECIFIED
                                                 ? fitrun::v1::PRECISION_FP32
                                                 : spec.precision()));
  for (char& c : key) {
    if (c == '\t' || c == '\n') c = ' ';  // the cache file's separators
  }
  return key;
}

ModelProfile CalibratedProfile(ModelProfile analytic, const ProbeResult& probe) {
  ModelProfile p = std::move(analytic);
  if (probe.model_state_bytes > 0) p.parameter_count = probe.model_state_bytes / 4;
  p.calibrated = true;
  p.calibrated_fixed_bytes = probe.fixed_bytes;
  p.activation_bytes_per_sample = probe.per_sample_bytes;
  p.input_bytes_per_sample = 0;
  p.calibrated_small_fixed_bytes = probe.small_fixed_bytes;
  p.calibrated_small_per_sample_bytes = probe.small_per_sample_bytes;
  p.memory_source = absl::StrCat("calibrated: fitrun-worker --probe measured ", FormatBytes(probe.fixed_bytes),
                                 " + ", FormatBytes(probe.per_sample_bytes), " per sample, at least ",
                                 FormatBytes(probe.small_fixed_bytes), " + ", FormatBytes(probe.small_per_sample_bytes),
                                 " per sample (micro-batches ", probe.small_batch, " to ", probe.large_batch, ")");
  return p;
}

absl::StatusOr<std::unique_ptr<MemoryCalibrator>> MemoryCalibrator::Create(Options options, MemoryProbe* probe) {
  if (probe == nullptr) return absl::InvalidArgumentError("memory calibrator: no probe");
  std::unique_ptr<MemoryCalibrator> calibrator(new MemoryCalibrator(std::move(options), probe));
  if (absl::Status status = calibrator->LoadCache(); !status.ok()) return status;
  return calibrator;
}

MemoryCalibrator::~MemoryCalibrator() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

absl::Status MemoryCalibrator::LoadCache() {
  if (options_.cache_path.empty()) return absl::OkStatus();
  std::ifstream in(options_.cache_path);
  if (!in) return absl::OkStatus();  // nothing measured yet
  std::string line;
  absl::MutexLock lock(&mu_);
  while (std::getline(in, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    ProbeResult r;
    // A torn last line (crash while appending) is skipped; the spec is probed again.
    if (fields.size() != 8 || !absl::SimpleAtoi(fields[1], &r.fixed_bytes) ||
        !absl::SimpleAtoi(fields[2], &r.per_sample_bytes) || !absl::SimpleAtoi(fields[3], &r.model_state_bytes) ||
        !absl::SimpleAtoi(fields[4], &r.small_batch) || !absl::SimpleAtoi(fields[5], &r.large_batch) ||
        !absl::SimpleAtoi(fields[6], &r.small_fixed_bytes) || !absl::SimpleAtoi(fields[7], &r.small_per_sample_bytes)) {
      continue;
    }
    done_.insert_or_assign(fields[0], r);
  }
  return absl::OkStatus();
}

void MemoryCalibrator::Store(const std::string& key, const absl::StatusOr<ProbeResult>& result) {
  absl::MutexLock lock(&mu_);
  done_.insert_or_assign(key, result);
  measuring_.erase(key);
  // Failures stay in memory only: a restarted coordinator tries again (the binary may be fixed).
  if (!result.ok() || options_.cache_path.empty()) return;
  std::ofstream out(options_.cache_path, std::ios::app);
  out << key << '\t' << result->fixed_bytes << '\t' << result->per_sample_bytes << '\t' << result->model_state_bytes
      << '\t' << result->small_batch << '\t' << result->large_batch << '\t' << result->small_fixed_bytes << '\t'
      << result->small_per_sample_bytes << '\n';
}

absl::StatusOr<ProbeResult> MemoryCalibrator::Calibrate(const fitrun::v1::JobSpec& spec) {
  const std::string key = CalibrationKey(spec);
  {
    absl::MutexLock lock(&mu_);
    auto measured = [&] { return done_.count(key) > 0 || measuring_.count(key) == 0; };
    mu_.Await(absl::Condition(&measured));
    if (auto it = done_.find(key); it != done_.end()) return it->second;
    measuring_[key] = true;
    ++probes_run_;
  }
  absl::StatusOr<ProbeResult> result = probe_->Probe(spec);
  Store(key, result);
  return result;
}

MemoryCalibrator::Lookup MemoryCalibrator::Find(const fitrun::v1::JobSpec& spec) {
  const std::string key = CalibrationKey(spec);
  absl::MutexLock lock(&mu_);
  Lookup lookup;
  if (auto it = done_.find(key); it != done_.end()) {
    if (it->second.ok()) {
      lookup.state = State::kReady;
      lookup.result = *it->second;
    } else {
      lookup.state = State::kFailed;
      lookup.error = it->second.status();
    }
  } else if (measuring_.count(key) > 0) {
    lookup.state = State::kMeasuring;
  }
  return lookup;
}

bool MemoryCalibrator::StartCalibration(const fitrun::v1::JobSpec& spec, std::function<void()> on_done) {
  const std::string key = CalibrationKey(spec);
  absl::MutexLock lock(&mu_);
  if (stopping_ || done_.count(key) > 0 || measuring_.count(key) > 0) return false;
  measuring_[key] = true;
  ++probes_run_;
  threads_.emplace_back([this, spec, key, on_done = std::move(on_done)] {
    absl::StatusOr<ProbeResult> result = probe_->Probe(spec);
    Store(key, result);
    if (on_done) on_done();
  });
  return true;
}

absl::StatusOr<ModelProfile> MemoryCalibrator::ProfileFor(const fitrun::v1::JobSpec& spec, bool probe_if_missing) {
  absl::StatusOr<ModelProfile> analytic = fitrun::server::ProfileFor(spec);
  if (!analytic.ok()) return analytic.status();
  absl::StatusOr<ProbeResult> probed = absl::NotFoundError("not measured yet");
  if (probe_if_missing) {
    probed = Calibrate(spec);
  } else {
    Lookup lookup = Find(spec);
    if (lookup.state == State::kReady) probed = lookup.result;
    if (lookup.state == State::kFailed) probed = lookup.error;
  }
  if (probed.ok()) return CalibratedProfile(*std::move(analytic), *probed);
  if (!absl::IsNotFound(probed.status())) {
    analytic->memory_source = absl::StrCat(analytic->memory_source, " (the memory probe failed: ",
                                           probed.status().message(), ")");
  }
  return analytic;
}

int64_t MemoryCalibrator::probes_run() {
  absl::MutexLock lock(&mu_);
  return probes_run_;
}

}  // namespace fitrun::server
