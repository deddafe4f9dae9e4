// memory_accuracy: how close the planner's memory estimate is to what a rank really takes.
//
// For each workload (mlp, cnn, two gpt sizes, sasrec) it calibrates the estimator as fitrund does
// (fitrun-worker --probe at micro-batches 4 and 16), then at four OTHER per-device batches measures
// the real peak: fitrun-worker --probe running real training steps (forward, backward, gradients in
// a flat bucket buffer as the DDP reducer keeps them, the spec's optimizer step) under the counting
// allocator, at exactly that batch. It prints, per batch, the planner's estimate (calibrated, with
// its margin), the measured peak and the error, beside what the analytic profile alone and a
// weights + gradients + optimizer-only estimate (DeepSpeed's / accelerate's kind) would say.
//
// Then a cap matrix: for several device caps the planner chooses a batch (one device, a global batch
// with many divisors, 5% headroom) and the chosen batch is measured: its peak as a share of the cap
// (target >= 85%) and whether it would run out of memory (peak > cap; target: never).
//
//   bazel build //worker:fitrun-worker //server/bench/memory_accuracy
//   bazel-bin/server/bench/memory_accuracy/memory_accuracy --worker_binary=bazel-bin/worker/fitrun-worker \
//       --movielens=/tmp/ratings.dat     # python3 tools/make_movielens_sample.py /tmp/ratings.dat
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/estimator.h"
#include "server/core/job_spec.h"
#include "server/core/memory_calibration.h"
#include "server/core/model_profile.h"
#include "server/core/planner.h"
#include "server/probe/process_memory_probe.h"

ABSL_FLAG(std::string, worker_binary, "bazel-bin/worker/fitrun-worker", "the fitrun-worker to measure with");
ABSL_FLAG(std::string, movielens, "/tmp/ratings.dat", "ratings file for sasrec (tools/make_movielens_sample.py)");
ABSL_FLAG(std::string, work_dir, "/tmp/fitrun-memory-accuracy", "scratch directory (text corpus, probe files)");
ABSL_FLAG(bool, cap_matrix, true, "also run the cap matrix");

namespace fitrun::server {
namespace {

struct Workload {
  std::string name;
  fitrun::v1::JobSpec spec;
  std::vector<int64_t> batches;  // measured; never the calibration batches 4 and 16
  std::vector<double> caps_mib;  // for the cap matrix (empty: skip)
  int64_t cap_global_batch = 0;  // a global batch with many divisors, at most the dataset's size
};

fitrun::v1::JobSpec BaseSpec(const std::string& name) {
  fitrun::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_global_batch_size(64);
  spec.set_max_steps(3);
  spec.set_precision(fitrun::v1::PRECISION_FP32);
  spec.set_seed(1);
  return spec;
}

fitrun::v1::JobSpec WithOptimizer(fitrun::v1::JobSpec spec, fitrun::v1::OptimizerKind kind, double momentum,
                                  double weight_decay) {
  spec.mutable_optimizer()->set_kind(kind);
  spec.mutable_optimizer()->set_lr(0.001);
  spec.mutable_optimizer()->set_momentum(momentum);
  spec.mutable_optimizer()->set_weight_decay(weight_decay);
  return spec;
}

std::vector<Workload> Workloads(const std::string& text_path, const std::string& movielens) {
  std::vector<Workload> out;
  {
    Workload w{"mlp (sgd+momentum)", BaseSpec("mlp"), {32, 128, 512, 2048}, {16, 20, 28, 40}, 55440};
    w.spec.mutable_model()->set_builtin("mlp");
    w.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
    w.spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
    w.spec = WithOptimizer(w.spec, fitrun::v1::OPTIMIZER_KIND_SGD, 0.9, 0);
    out.push_back(w);
  }
  {
    Workload w{"cnn (adam)", BaseSpec("cnn"), {8, 32, 64, 128}, {}, 0};
    w.spec.mutable_model()->set_builtin("cnn");
    w.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
    w.spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
    w.spec = WithOptimizer(w.spec, fitrun::v1::OPTIMIZER_KIND_ADAM, 0, 0);
    out.push_back(w);
  }
  {
    Workload w{"gpt 2x64, ctx 64 (adamw)", BaseSpec("gpt-small"), {8, 32, 64, 128}, {16, 32, 64, 128}, 2520};
    w.spec.mutable_model()->set_builtin("gpt");
    auto* c = w.spec.mutable_model()->mutable_gpt();
    c->set_layers(2);
    c->set_heads(4);
    c->set_hidden(64);
    c->set_context(64);
    w.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_TEXT);
    w.spec.mutable_data()->set_path(text_path);
    w.spec = WithOptimizer(w.spec, fitrun::v1::OPTIMIZER_KIND_ADAMW, 0, 0.01);
    out.push_back(w);
  }
  {
    Workload w{"gpt 4x128, ctx 128 (adamw)", BaseSpec("gpt-large"), {8, 24, 48, 96}, {64, 128, 256}, 1680};
    w.spec.mutable_model()->set_builtin("gpt");
    auto* c = w.spec.mutable_model()->mutable_gpt();
    c->set_layers(4);
    c->set_heads(4);
    c->set_hidden(128);
    c->set_context(128);
    w.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_TEXT);
    w.spec.mutable_data()->set_path(text_path);
    w.spec = WithOptimizer(w.spec, fitrun::v1::OPTIMIZER_KIND_ADAMW, 0, 0.01);
    out.push_back(w);
  }
  {
    Workload w{"sasrec 2x64, len 50 (adam)", BaseSpec("sasrec"), {8, 32, 128, 512}, {16, 32, 64}, 1680};
    w.spec.mutable_model()->set_builtin("sasrec");
    auto* c = w.spec.mutable_model()->mutable_sasrec();
    c->set_max_len(50);
    c->set_hidden(64);
    c->set_blocks(2);
    c->set_heads(1);
    w.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_MOVIELENS);
    w.spec.mutable_data()->set_path(movielens);
    w.spec = WithOptimizer(w.spec, fitrun::v1::OPTIMIZER_KIND_ADAM, 0, 0);
    out.push_back(w);
  }
  for (Workload& w : out) ApplyJobSpecDefaults(w.spec);
  return out;
}

// The peak of real training steps at exactly `batch` (the probe's second batch size).
absl::StatusOr<int64_t> MeasurePeak(const ProcessMemoryProbe::Options& base, const fitrun::v1::JobSpec& spec,
                                    int64_t batch) {
  ProcessMemoryProbe::Options options = base;
  options.small_batch = 1;
  options.large_batch = batch;
  options.large_batches = false;
  absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> probe = ProcessMemoryProbe::Create(options);
  if (!probe.ok()) return probe.status();
  absl::StatusOr<ProbeResult> r = (*probe)->Probe(spec);
  if (!r.ok()) return r.status();
  return r->large_peak_bytes;
}

// Weights + gradients + optimizer state only, fp32: what model-state estimators say.
int64_t StatesOnly(const ModelProfile& analytic, const fitrun::v1::JobSpec& spec) {
  fitrun::v1::MemoryBreakdown m = EstimateRankMemory(analytic, spec, 0);
  return m.weights_bytes() + m.gradients_bytes() + m.optimizer_state_bytes();
}

double Error(int64_t predicted, int64_t measured) {
  return 100.0 * (static_cast<double>(predicted) - static_cast<double>(measured)) / static_cast<double>(measured);
}

std::string MiB(int64_t bytes) { return absl::StrFormat("%.2f", static_cast<double>(bytes) / (1 << 20)); }

int Run() {
  const std::string work_dir = absl::GetFlag(FLAGS_work_dir);
  std::filesystem::create_directories(work_dir);
  // A text corpus every Debian machine has: the licenses in /usr/share/common-licenses.
  const std::string text_path = (std::filesystem::path(work_dir) / "licenses.txt").string();
  {
    std::ofstream out(text_path, std::ios::binary);
    for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      out << in.rdbuf();
    }
  }
  ProcessMemoryProbe::Options probe_options;
  probe_options.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  probe_options.work_dir = work_dir;
  probe_options.timeout = absl::Minutes(10);
  absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> calibration_probe = ProcessMemoryProbe::Create(probe_options);
  if (!calibration_probe.ok()) {
    std::fprintf(stderr, "%s\n", std::string(calibration_probe.status().message()).c_str());
    return 1;
  }
  const EstimatorOptions estimator;
  std::vector<Workload> workloads = Workloads(text_path, absl::GetFlag(FLAGS_movielens));

  std::printf("Estimator accuracy: calibrated as fitrund does (fitrun-worker --probe at micro-batches %lld and %lld,\n"
              "then at two large ones it picks), measured at four others (MiB)\n\n",
              static_cast<long long>(probe_options.small_batch), static_cast<long long>(probe_options.large_batch));
  std::printf("| model | batch | predicted | measured peak | error | analytic only | error | weights+grads+optimizer | error |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double worst = 0;
  std::vector<ModelProfile> calibrated_profiles;
  for (const Workload& w : workloads) {
    absl::StatusOr<ModelProfile> analytic = ProfileFor(w.spec);
    absl::StatusOr<ProbeResult> line = analytic.ok() ? (*calibration_probe)->Probe(w.spec)
                                                     : absl::StatusOr<ProbeResult>(analytic.status());
    if (!line.ok()) {
      std::printf("| %s | - | %s |\n", w.name.c_str(), std::string(line.status().message()).c_str());
      calibrated_profiles.emplace_back();
      continue;
    }
    const ModelProfile calibrated = CalibratedProfile(*analytic, *line);
    calibrated_profiles.push_back(calibrated);
    std::fprintf(stderr, "%s: %s\n", w.name.c_str(), calibrated.memory_source.c_str());
    for (const int64_t b : w.batches) {
      absl::StatusOr<int64_t> measured = MeasurePeak(probe_options, w.spec, b);
      if (!measured.ok()) {
        std::printf("| %s | %lld | %s |\n", w.name.c_str(), static_cast<long long>(b),
                    std::string(measured.status().message()).c_str());
        continue;
      }
      const int64_t predicted = EstimateRankMemory(calibrated, w.spec, b, estimator).total_bytes();
      const int64_t analytic_only = EstimateRankMemory(*analytic, w.spec, b, estimator).total_bytes();
      const int64_t states = StatesOnly(*analytic, w.spec);
      worst = std::max(worst, std::abs(Error(predicted, *measured)));
      std::printf("| %s | %lld | %s | %s | %+.1f%% | %s | %+.0f%% | %s | %+.0f%% |\n", w.name.c_str(),
                  static_cast<long long>(b), MiB(predicted).c_str(), MiB(*measured).c_str(),
                  Error(predicted, *measured), MiB(analytic_only).c_str(), Error(analytic_only, *measured),
                  MiB(states).c_str(), Error(states, *measured));
      std::fflush(stdout);
    }
  }
  std::printf("\nworst |error| of the calibrated estimate: %.1f%% (target <= 10%%)\n", worst);
  if (!absl::GetFlag(FLAGS_cap_matrix)) return 0;

  std::printf("\nCap matrix: one device of each cap, 5%% headroom, the planner's batch measured\n\n");
  std::printf("| model | cap (MiB) | global batch | planned batch x accumulation | predicted | measured peak | peak / cap | OOM |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  double lowest_use = 1;
  int ooms = 0;
  for (size_t i = 0; i < workloads.size(); ++i) {
    const Workload& w = workloads[i];
    if (w.caps_mib.empty() || !calibrated_profiles[i].calibrated) continue;
    fitrun::v1::JobSpec spec = w.spec;
    spec.set_global_batch_size(w.cap_global_batch);
    spec.mutable_resources()->set_min_devices(1);
    spec.mutable_resources()->set_max_devices(1);
    spec.mutable_resources()->set_memory_headroom(0.05);
    for (const double cap_mib : w.caps_mib) {
      const int64_t cap = static_cast<int64_t>(cap_mib * (1 << 20));
      absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, calibrated_profiles[i], {{"cpu:0", cap}}, estimator);
      if (!plan.ok()) {
        std::printf("| %s | %.0f | %lld | %s |\n", w.name.c_str(), cap_mib,
                    static_cast<long long>(w.cap_global_batch), std::string(plan.status().message()).c_str());
        continue;
      }
      absl::StatusOr<int64_t> measured = MeasurePeak(probe_options, spec, plan->per_device_batch());
      if (!measured.ok()) {
        std::printf("| %s | %.0f | %lld | %lld | %s |\n", w.name.c_str(), cap_mib,
                    static_cast<long long>(w.cap_global_batch), static_cast<long long>(plan->per_device_batch()),
                    std::string(measured.status().message()).c_str());
        continue;
      }
      const double use = static_cast<double>(*measured) / static_cast<double>(cap);
      lowest_use = std::min(lowest_use, use);
      ooms += *measured > cap ? 1 : 0;
      std::printf("| %s | %.0f | %lld | %lld x %d | %s | %s | %.1f%% | %s |\n", w.name.c_str(), cap_mib,
                  static_cast<long long>(w.cap_global_batch), static_cast<long long>(plan->per_device_batch()),
                  plan->grad_accum_steps(), MiB(plan->predicted().total_bytes()).c_str(), MiB(*measured).c_str(),
                  100 * use, *measured > cap ? "yes" : "no");
      std::fflush(stdout);
    }
  }
  std::printf("\nlowest peak / cap: %.1f%% (target >= 85%%); out of memory: %d (target 0)\n", 100 * lowest_use, ooms);
  return 0;
}

}  // namespace
}  // namespace fitrun::server

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fitrun::server::Run();
}
