// memory_accuracy: how close the planner's memory estimate is to what a rank really takes, over every
// built-in model (the transformers also recomputing their activations), optimizer and precision, at
// per-device batches across the whole range a planner can choose on a device (from 1 to the largest
// that fits it).
//
// For each workload (model x optimizer x precision) it calibrates as fitrund does (the sweep of
// server/core/memory/memory_curve.h through fitrun-worker --probe, up to the device's memory), then, in a
// separate probe process, measures the real peak at batches the sweep did not choose: odd sizes
// spread from 1 to the largest batch the estimate fits on the device. Each is the peak of real
// training steps (forward, backward into gradients that are views of one flat bucket buffer, the
// spec's optimizer step) under the counting allocator, at exactly that batch. It prints a summary row
// per workload (the worst errors) and the full table, with what the analytic profile alone and a
// weights + gradients + optimizer-only estimate (DeepSpeed's / accelerate's kind) would say.
// The estimate printed is the one before any measurement a plan would add at launch: beyond the
// largest batch the sweep measured it is an extrapolation, marked "x".
//
// Then a cap matrix: for several device caps the planner chooses a batch (one device, a global batch
// with many divisors, 5% headroom) and the chosen batch is measured: its peak as a share of the cap
// and whether it would run out of memory (peak > cap).
//
//   bazel build -c opt //worker:fitrun-worker //server/bench/memory_accuracy
//   python3 tools/make_movielens_sample.py /tmp/ratings.dat
//   bazel-bin/server/bench/memory_accuracy/memory_accuracy --worker_binary=bazel-bin/worker/fitrun-worker
//       --movielens=/tmp/ratings.dat [--models=mlp,cnn] [--optimizers=adam] [--precisions=fp32]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/contract/log.h"
#include "server/core/memory/estimator.h"
#include "server/core/specs/workloads.h"
#include "server/core/specs/job_specs.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/core/memory/model_profile.h"
#include "server/core/memory/planner.h"
#include "server/probe/process_memory_probe.h"

ABSL_FLAG(std::string, worker_binary, "bazel-bin/worker/fitrun-worker", "the fitrun-worker to measure with");
ABSL_FLAG(std::string, movielens, "/tmp/ratings.dat", "ratings file for sasrec (tools/make_movielens_sample.py)");
ABSL_FLAG(std::string, work_dir, "/tmp/fitrun-memory-accuracy", "scratch directory (text corpus, probe files)");
ABSL_FLAG(int64_t, device_mib, 2048, "the device the batches range over, in MiB");
ABSL_FLAG(std::string, models, "mlp,cnn,gpt-small,gpt-large,sasrec,gpt-large-recompute,sasrec-recompute",
          "which models");
ABSL_FLAG(std::string, optimizers, "sgd,sgd+momentum,adam,adamw", "which optimizers");
ABSL_FLAG(std::string, precisions, "fp32,bf16", "which precisions");
ABSL_FLAG(bool, cap_matrix, true, "also run the cap matrix (fp32)");

namespace fitrun::server {
namespace {

struct Model {
  std::string key;   // as --models names it
  std::string name;
  fitrun::v1::JobSpec spec;      // model and data
  std::vector<double> caps_mib;  // for the cap matrix
  int64_t cap_global_batch = 0;  // a global batch with many divisors, at most the dataset's size
};

std::vector<Model> Models(const std::string& text_path, const std::string& movielens) {
  std::vector<Model> out;
  auto base = [](const std::string& name) {
    fitrun::v1::JobSpec spec;
    spec.set_name(name);
    spec.set_global_batch_size(64);
    spec.set_max_steps(3);
    spec.set_seed(1);
    return spec;
  };
  {
    Model m{"mlp", "mlp", base("mlp"), {16, 24, 40, 64}, 55440};
    m.spec.mutable_model()->set_builtin("mlp");
    m.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
    m.spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
    out.push_back(m);
  }
  {
    Model m{"cnn", "cnn", base("cnn"), {48, 96, 192}, 55440};
    m.spec.mutable_model()->set_builtin("cnn");
    m.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
    m.spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
    out.push_back(m);
  }
  for (const auto& [name, layers, hidden, context, caps, global] :
       std::vector<std::tuple<std::string, int, int, int, std::vector<double>, int64_t>>{
           {"gpt-small", 2, 64, 64, {16, 64, 128}, 2520}, {"gpt-large", 4, 128, 128, {64, 256}, 1680}}) {
    Model m{name, absl::StrFormat("gpt %dx%d, ctx %d", layers, hidden, context), base(name), caps, global};
    m.spec.mutable_model()->set_builtin("gpt");
    auto* c = m.spec.mutable_model()->mutable_gpt();
    c->set_layers(layers);
    c->set_heads(4);
    c->set_hidden(hidden);
    c->set_context(context);
    m.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_TEXT);
    m.spec.mutable_data()->set_path(text_path);
    out.push_back(m);
  }
  {
    Model m{"sasrec", "sasrec 2x64, len 50", base("sasrec"), {16, 64}, 1680};
    m.spec.mutable_model()->set_builtin("sasrec");
    auto* c = m.spec.mutable_model()->mutable_sasrec();
    c->set_max_len(50);
    c->set_hidden(64);
    c->set_blocks(2);
    c->set_heads(1);
    m.spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_MOVIELENS);
    m.spec.mutable_data()->set_path(movielens);
    out.push_back(m);
  }
  // The transformers recomputing their blocks' activations in backward: a workload of their own.
  for (const Model& kept : std::vector<Model>(out)) {
    if (kept.key != "gpt-large" && kept.key != "sasrec") continue;
    Model m = kept;
    m.key = kept.key + "-recompute";
    m.name = kept.name + ", recomputed";
    m.spec.set_name(m.key);
    if (kept.key == "sasrec") {
      m.spec.mutable_model()->mutable_sasrec()->set_activation_checkpointing(true);
    } else {
      m.spec.mutable_model()->mutable_gpt()->set_activation_checkpointing(true);
    }
    out.push_back(m);
  }
  return out;
}

fitrun::v1::JobSpec WithOptimizer(fitrun::v1::JobSpec spec, const std::string& optimizer) {
  auto* o = spec.mutable_optimizer();
  o->set_lr(0.001);
  if (optimizer == "sgd" || optimizer == "sgd+momentum") o->set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
  if (optimizer == "sgd+momentum") o->set_momentum(0.9);
  if (optimizer == "adam") o->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAM);
  if (optimizer == "adamw") {
    o->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAMW);
    o->set_weight_decay(0.01);
  }
  return spec;
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

// The largest batch whose estimate fits `bytes`, at most `limit`.
int64_t LargestFitting(const ModelProfile& profile, const fitrun::v1::JobSpec& spec, int64_t bytes, int64_t limit) {
  auto fits = [&](int64_t b) { return EstimateRankMemory(profile, spec, b).total_bytes() <= bytes; };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = limit;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Batches from 1 to `largest` that a sweep doubling from 1 never picks: odd sizes about 2.7x apart.
std::vector<int64_t> TestBatches(int64_t largest) {
  std::set<int64_t> batches = {1};
  for (int64_t b : {3, 7, 19, 50, 135, 365, 1000, 2700, 7300, 19700, 53000}) {
    if (b < largest) batches.insert(b);
  }
  batches.insert(largest);
  return {batches.begin(), batches.end()};
}

struct Row {
  std::string workload;
  int measured = 0;
  int points = 0;
  int64_t largest = 0;
  double seconds = 0;
  // The lowest and highest error over the measured batches, % (both positive when every prediction is
  // above its measured peak).
  double worst_under = std::numeric_limits<double>::infinity();
  double worst_over = -std::numeric_limits<double>::infinity();
  std::string note;
};

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
  probe_options.measure_timeout = absl::Minutes(20);
  absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> probe = ProcessMemoryProbe::Create(probe_options);
  if (!probe.ok()) {
    fitrun::contract::LogError("%s", probe.status().message());
    return 1;
  }
  const int64_t device_bytes = absl::GetFlag(FLAGS_device_mib) << 20;
  const std::set<std::string> wanted_models = absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  const std::vector<std::string> optimizers = absl::StrSplit(absl::GetFlag(FLAGS_optimizers), ',');
  const std::vector<std::string> precisions = absl::StrSplit(absl::GetFlag(FLAGS_precisions), ',');

  std::vector<Row> rows;
  // The full table goes out row by row as workloads finish (a run takes hours); the summary at the end.
  std::printf("how: m = a batch the sweep measured, i = between two it measured, x = extrapolated beyond the "
              "largest\n\n| workload | batch | how | predicted | measured peak | error | analytic only | error | "
              "weights+grads+optimizer | error |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::fflush(stdout);
  std::string table;
  struct Calibrated {
    Model model;
    std::string optimizer;
    ModelProfile profile;
  };
  std::vector<Calibrated> for_caps;
  for (const Model& model : Models(text_path, absl::GetFlag(FLAGS_movielens))) {
    if (wanted_models.count(model.key) == 0) continue;
    for (const std::string& optimizer : optimizers) {
      for (const std::string& precision : precisions) {
        fitrun::v1::JobSpec spec = WithOptimizer(model.spec, optimizer);
        spec.set_precision(precision == "bf16" ? fitrun::v1::PRECISION_BF16 : fitrun::v1::PRECISION_FP32);
        ApplyJobSpecDefaults(spec);
        Row row;
        row.workload = absl::StrCat(model.name, ", ", optimizer, ", ", precision);
        // What fitrund reads of the spec's files at submit, which the profile is sized by.
        fitrun::v1::SpecFileFacts facts;
        if (absl::Status admitted = ValidateModelAndData(spec, &facts); !admitted.ok()) {
          row.note = std::string(admitted.message());
          rows.push_back(row);
          continue;
        }
        *spec.mutable_file_facts() = facts;
        absl::StatusOr<ModelProfile> analytic = ProfileFor(spec);
        if (!analytic.ok()) {
          row.note = std::string(analytic.status().message());
          rows.push_back(row);
          continue;
        }
        // As fitrund calibrates a job that could take any batch on this device.
        auto calibrator = *MemoryCalibrator::Create({}, probe->get());
        SweepLimits limits;
        limits.max_batch = analytic->train_samples;
        limits.max_bytes = device_bytes;
        const absl::Time start = absl::Now();
        absl::StatusOr<Calibration> calibration = calibrator->CalibrateNow(spec, limits);
        row.seconds = absl::ToDoubleSeconds(absl::Now() - start);
        if (!calibration.ok()) {
          row.note = std::string(calibration.status().message());
          rows.push_back(row);
          continue;
        }
        const ModelProfile profile = CalibratedProfile(*analytic, *calibration, 0.03);
        if (precision == "fp32" && (optimizer == "adam" || optimizer == "sgd+momentum")) {
          for_caps.push_back({model, optimizer, profile});
          for_caps.back().model.spec = spec;
        }
        row.points = static_cast<int>(calibration->measured.points().size());
        row.note = calibration->sweep_note;
        row.largest = LargestFitting(profile, spec, device_bytes, analytic->train_samples);
        std::fprintf(stderr, "%s: %s; largest batch on %s: %lld\n", row.workload.c_str(),
                     profile.memory_source.c_str(), MiB(device_bytes).c_str(), static_cast<long long>(row.largest));
        absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session =
            (*probe)->Start(spec, device_bytes + device_bytes / 4, "");
        if (!session.ok()) {
          row.note = std::string(session.status().message());
          rows.push_back(row);
          continue;
        }
        for (const int64_t b : TestBatches(row.largest)) {
          absl::StatusOr<int64_t> measured = (*session)->MeasurePeak(b);
          if (!measured.ok()) {
            absl::StrAppend(&table, "| ", row.workload, " | ", b, " | ", measured.status().message(), " |\n");
            continue;
          }
          const int64_t predicted = EstimateRankMemory(profile, spec, b).total_bytes();
          const int64_t analytic_only = EstimateRankMemory(*analytic, spec, b).total_bytes();
          const int64_t states = StatesOnly(*analytic, spec);
          const double error = Error(predicted, *measured);
          row.worst_under = std::min(row.worst_under, error);
          row.worst_over = std::max(row.worst_over, error);
          ++row.measured;
          const std::string how = profile.measured->Measured(b)             ? "m"
                                  : b > profile.measured->largest_batch() ? "x"
                                                                            : "i";
          absl::StrAppend(&table, absl::StrFormat("| %s | %d | %s | %s | %s | %+.1f%% | %s | %+.0f%% | %s | %+.0f%% |\n",
                                                  row.workload, b, how, MiB(predicted), MiB(*measured), error,
                                                  MiB(analytic_only), Error(analytic_only, *measured), MiB(states),
                                                  Error(states, *measured)));
        }
        rows.push_back(row);
        std::printf("%s", table.c_str());
        std::fflush(stdout);
        table.clear();
        std::fprintf(stderr, "  worst errors %+.1f%% .. %+.1f%% over %d batches\n", row.worst_under, row.worst_over,
                     row.measured);
      }
    }
  }

  std::printf("\nEstimator accuracy on a %s MiB device: calibrated as fitrund does, measured at batches the sweep "
              "did not choose, from 1 to the largest the estimate fits\n\n",
              MiB(device_bytes).c_str());
  std::printf("| workload | batches measured | largest | sweep points | sweep seconds | lowest error | highest error | sweep stopped because |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  double worst_under = std::numeric_limits<double>::infinity();
  double worst_over = -std::numeric_limits<double>::infinity();
  for (const Row& r : rows) {
    worst_under = std::min(worst_under, r.worst_under);
    worst_over = std::max(worst_over, r.worst_over);
    std::printf("| %s | %d | %lld | %d | %.1f | %+.1f%% | %+.1f%% | %s |\n", r.workload.c_str(), r.measured,
                static_cast<long long>(r.largest), r.points, r.seconds, r.worst_under, r.worst_over, r.note.c_str());
  }
  std::printf("\nover every batch: the lowest error %+.1f%% (target >= 0), the highest %+.1f%% (target <= +10%%)\n",
              worst_under, worst_over);
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_cap_matrix)) return 0;

  std::printf("\nCap matrix: one device of each cap, 5%% headroom, the planner's batch measured\n\n");
  std::printf("| model | cap (MiB) | global batch | planned batch x accumulation | predicted | measured peak | peak / cap | OOM |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  double lowest_use = 1;
  int ooms = 0;
  for (const Calibrated& c : for_caps) {
    fitrun::v1::JobSpec spec = c.model.spec;
    spec.set_global_batch_size(c.model.cap_global_batch);
    spec.mutable_resources()->set_min_devices(1);
    spec.mutable_resources()->set_max_devices(1);
    spec.mutable_resources()->set_memory_headroom(0.05);
    const std::string name = absl::StrCat(c.model.name, " (", c.optimizer, ")");
    for (const double cap_mib : c.model.caps_mib) {
      const int64_t cap = static_cast<int64_t>(cap_mib * (1 << 20));
      absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, c.profile, {{"cpu:0", cap}});
      if (!plan.ok()) {
        std::printf("| %s | %.0f | %lld | %s |\n", name.c_str(), cap_mib, static_cast<long long>(c.model.cap_global_batch),
                    std::string(plan.status().message()).c_str());
        continue;
      }
      absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = (*probe)->Start(spec, 2 * cap, "");
      absl::StatusOr<int64_t> measured =
          session.ok() ? (*session)->MeasurePeak(plan->per_device_batch()) : absl::StatusOr<int64_t>(session.status());
      if (!measured.ok()) {
        std::printf("| %s | %.0f | %lld | %lld | %s |\n", name.c_str(), cap_mib,
                    static_cast<long long>(c.model.cap_global_batch), static_cast<long long>(plan->per_device_batch()),
                    std::string(measured.status().message()).c_str());
        continue;
      }
      const double use = static_cast<double>(*measured) / static_cast<double>(cap);
      lowest_use = std::min(lowest_use, use);
      ooms += *measured > cap ? 1 : 0;
      std::printf("| %s | %.0f | %lld | %lld x %d | %s | %s | %.1f%% | %s |\n", name.c_str(), cap_mib,
                  static_cast<long long>(c.model.cap_global_batch), static_cast<long long>(plan->per_device_batch()),
                  plan->grad_accum_steps(), MiB(plan->predicted().total_bytes()).c_str(), MiB(*measured).c_str(),
                  100 * use, *measured > cap ? "yes" : "no");
      std::fflush(stdout);
    }
  }
  std::printf("\nlowest peak / cap: %.1f%%; out of memory: %d (target 0)\n", 100 * lowest_use, ooms);
  return 0;
}

}  // namespace
}  // namespace fitrun::server

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fitrun::server::Run();
}
