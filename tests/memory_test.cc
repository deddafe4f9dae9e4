// The memory estimator end to end: real fitrund (which calibrates the model with fitrun-worker
// --probe), real workers under the capped allocator on small virtual CPU devices.
//
// What is compared: the plan's predicted.total_bytes (the estimate the planner checks against each
// device's usable memory: the probe's measured line at the chosen batch plus the estimator's small
// calibrated margin) against the highest Progress.peak_bytes each rank reports, which is the
// capped allocator's peak since it was installed (model state, gradients, optimizer state, DDP
// buckets, activations, everything the rank's tensors took). Both count the same bytes the cap
// counts: the device's total_bytes is the cap, and the planner's free memory is that same figure.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "tests/testing/coordinator.h"

namespace fitrun::testing {
namespace {

using ::testing::HasSubstr;

// Two devices of 8 MiB: the 2-layer GPT's 16 samples per rank per step do not fit in one pass
// (about 17 MB), 4 do (about 6.3 MB).
constexpr char kSmallDevices[] = "cpu:2x8MiB";

// `bytes` of words: 6400 make 89 training windows of 64 bytes and 9 test windows.
std::string WriteText(const std::string& name, size_t bytes = 6400) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = (std::filesystem::path(dir != nullptr ? dir : "/tmp") / name).string();
  static const char* kWords[] = {"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with"};
  std::mt19937 random(1);
  std::string text;
  while (text.size() < bytes) absl::StrAppend(&text, kWords[random() % 12], " ");
  text.resize(bytes);
  std::ofstream(path) << text;
  return path;
}

// The highest peak any rank reported in `events`, and whether one ran out of memory.
struct Peaks {
  int64_t highest = 0;
  int ranks = 0;
  bool out_of_memory = false;
};
Peaks PeaksOf(const std::vector<fitrun::v1::JobEvent>& events) {
  std::map<int, int64_t> by_rank;
  Peaks peaks;
  for (const fitrun::v1::JobEvent& event : events) {
    peaks.out_of_memory |= event.has_oom();
    if (!event.has_progress()) continue;
    int64_t& peak = by_rank[event.progress().rank()];
    peak = std::max(peak, event.progress().peak_bytes());
  }
  for (const auto& [rank, peak] : by_rank) peaks.highest = std::max(peaks.highest, peak);
  peaks.ranks = static_cast<int>(by_rank.size());
  return peaks;
}

std::string GptSpec(const std::string& name, const std::string& text_path, const std::string& resources) {
  return absl::StrCat("name: ", name, R"(
model:
  builtin: gpt
  gpt: {layers: 2, heads: 4, hidden: 64, context: 64}
data: {kind: text, path: )", text_path, R"(}
optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01}
global_batch_size: 32
max_steps: 5
precision: fp32
seed: 1
fault_tolerance: {max_oom_retries: 0, max_restarts: 0}
resources: )", resources, "\n");
}

TEST(MemoryTest, PlannedBatchRunsWithinTenPercentOfThePredictionAndALargerFixedBatchRunsOutOfMemory) {
  RunningCoordinator coordinator("memory", kSmallDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  const std::string text = WriteText("memory-text.txt");

  // The planner's choice: less than the 16 samples each rank takes per step, with accumulation.
  absl::StatusOr<fitrun::v1::Job> job =
      coordinator.Submit(GptSpec("gpt-planned", text, "{min_devices: 2, max_devices: 2}"));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << "\n"
                                                           << ReadFile(coordinator.log_path());
  const fitrun::v1::Plan& plan = done.plan();
  EXPECT_EQ(plan.device_ids_size(), 2);
  EXPECT_LT(plan.per_device_batch(), 16);
  EXPECT_GT(plan.grad_accum_steps(), 1);
  EXPECT_EQ(plan.device_ids_size() * plan.per_device_batch() * plan.grad_accum_steps(), 32);
  bool calibrated = false;
  for (const std::string& reason : plan.reasons()) calibrated |= reason.find("memory estimate: calibrated") == 0;
  EXPECT_TRUE(calibrated) << plan.ShortDebugString();

  std::map<int, int64_t> peak_by_rank;
  for (const fitrun::v1::JobEvent& event : events) {
    EXPECT_FALSE(event.has_oom()) << event.ShortDebugString();
    if (!event.has_progress()) continue;
    int64_t& peak = peak_by_rank[event.progress().rank()];
    peak = std::max(peak, event.progress().peak_bytes());
  }
  ASSERT_EQ(peak_by_rank.size(), 2u);
  const double predicted = static_cast<double>(plan.predicted().total_bytes());
  for (const auto& [rank, peak] : peak_by_rank) {
    const double error = (predicted - static_cast<double>(peak)) / static_cast<double>(peak);
    std::printf("rank %d: predicted %.0f bytes, measured peak %lld bytes, error %+.2f%%\n", rank, predicted,
                static_cast<long long>(peak), 100 * error);
    EXPECT_LE(std::abs(error), 0.10) << "rank " << rank << ": predicted " << predicted << ", measured " << peak;
    EXPECT_LE(peak, 8LL << 20);
  }

  // The same job with the per-device batch fixed at 16 by the spec: planned anyway (the user's call)
  // and it runs out of the cap for real.
  absl::StatusOr<fitrun::v1::Job> forced =
      coordinator.Submit(GptSpec("gpt-forced", text, "{min_devices: 2, max_devices: 2, per_device_batch: 16}"));
  ASSERT_TRUE(forced.ok()) << forced.status();
  const std::vector<fitrun::v1::JobEvent> forced_events = coordinator.Watch(forced->id());
  const fitrun::v1::Job failed = coordinator.Get(forced->id());
  ASSERT_EQ(failed.state(), fitrun::v1::JOB_STATE_FAILED) << ReadFile(coordinator.log_path());
  EXPECT_EQ(failed.plan().per_device_batch(), 16);
  bool predicted_not_to_fit = false;
  for (const std::string& reason : failed.plan().reasons()) {
    predicted_not_to_fit |= reason.find("PREDICTED NOT TO FIT") != std::string::npos;
  }
  EXPECT_TRUE(predicted_not_to_fit);
  EXPECT_THAT(absl::AsciiStrToLower(failed.failure_reason()), HasSubstr("memory"));
  bool oom_event = false;
  for (const fitrun::v1::JobEvent& event : forced_events) {
    if (!event.has_oom()) continue;
    oom_event = true;
    EXPECT_EQ(event.oom().per_device_batch(), 16);
    EXPECT_EQ(event.oom().cap_bytes(), 8LL << 20);
  }
  EXPECT_TRUE(oom_event);
  // The rank that hit the cap says so as it fails and exits with its own code: the coordinator stops
  // its peer at once but leaves that rank to finish its last report.
  ASSERT_TRUE(WaitFor([&] { return WorkersUnder(coordinator.state_dir()).empty(); }, absl::Seconds(10)));
  bool rank_failed_out_of_memory = false;
  for (const fitrun::v1::JobEvent& event : coordinator.Watch(forced->id(), 1, absl::Seconds(20))) {
    rank_failed_out_of_memory |= event.has_log() && event.log().text().find("out of device memory") != std::string::npos;
  }
  EXPECT_TRUE(rank_failed_out_of_memory);
  // The coordinator records each rank's exit when it reaps the process, a moment after it is gone.
  fitrun::v1::Job ended;
  EXPECT_TRUE(WaitFor(
      [&] {
        ended = coordinator.Get(forced->id());
        if (ended.attempt_history_size() != 1) return false;
        for (const fitrun::v1::RankOutcome& rank : ended.attempt_history(0).ranks()) {
          if (!rank.exited()) return false;
        }
        return true;
      },
      absl::Seconds(10)));
  ASSERT_EQ(ended.attempt_history_size(), 1);
  bool exited_out_of_memory = false;  // exit code 3
  for (const fitrun::v1::RankOutcome& rank : ended.attempt_history(0).ranks()) {
    exited_out_of_memory |= rank.exit_code() == 3;
  }
  EXPECT_TRUE(exited_out_of_memory) << ended.attempt_history(0).ShortDebugString();
}

// One built-in workload on two capped devices: its model and data, and a global batch whose per-rank
// share has divisors every few percent around the batch that fills the cap, so the planner's
// choice (the largest divisor that fits) is close to the cap.
struct CappedCase {
  std::string name;
  std::string model_and_data;  // YAML lines
  int64_t cap_mib;
  int64_t global_batch;
  std::string optimizer;  // YAML
};

// The planner's choice on capped devices, for each built-in model, two with Adam and two with SGD (the
// estimator accuracy bench, server/bench/memory_accuracy, runs every model with every optimizer): the
// global batch is far more than fits in one pass, so it picks the largest per-device batch that fits;
// that batch runs without running out of memory and fills at least 80% of the cap. (The transformers
// keep their activations: a plan that recomputes them picks its batch by step time too.)
TEST(MemoryTest, EachBuiltInModelRunsAtTheLargestFittingBatchWithoutOutOfMemory) {
  const std::string text = WriteText("capped-text.txt", 160000);
  const std::string ratings = FreshTestDir("capped-ratings") + "/ratings.dat";
  const CommandResult sample =
      RunCommand({"/usr/bin/python3", Runfile("tools/make_movielens_sample.py"), ratings});
  ASSERT_EQ(sample.exit_code, 0) << sample.err;
  const std::vector<CappedCase> cases = {
      {"mlp", "model: {builtin: mlp}\ndata: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n", 24,
       55440, "{kind: adam, lr: 0.001}"},
      {"cnn", "model: {builtin: cnn}\ndata: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n", 64,
       5040, "{kind: sgd, lr: 0.01}"},
      {"gpt", absl::StrCat("model: {builtin: gpt, gpt: {layers: 2, heads: 4, hidden: 64, context: 64, "
                           "activation_checkpointing: false}}\n"
                           "data: {kind: text, path: ", text, "}\n"), 40, 1680, "{kind: adam, lr: 0.001}"},
      {"sasrec", absl::StrCat("model: {builtin: sasrec, sasrec: {max_len: 50, hidden: 64, blocks: 2, heads: 1, "
                              "activation_checkpointing: false}}\n"
                              "data: {kind: movielens, path: ", ratings, "}\n"), 24, 1680, "{kind: sgd, lr: 0.01}"},
  };
  std::string table = "model, optimizer: cap, planned batch x accumulation, predicted, measured peak, peak / cap\n";
  for (const CappedCase& c : cases) {
    RunningCoordinator coordinator(absl::StrCat("capped-", c.name), absl::StrCat("cpu:2x", c.cap_mib, "MiB"));
    ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
    const int64_t cap = c.cap_mib << 20;
    const std::string spec = absl::StrCat("name: capped-", c.name, "\n", c.model_and_data, "optimizer: ", c.optimizer,
                                          "\nglobal_batch_size: ", c.global_batch,
                                          "\nmax_steps: 2\nseed: 1\n"
                                          "resources: {min_devices: 2, max_devices: 2, memory_headroom: 0.05}\n"
                                          "fault_tolerance: {max_oom_retries: 0}\n");
    absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    const Peaks peaks = PeaksOf(coordinator.Watch(job->id()));
    const fitrun::v1::Job done = coordinator.Get(job->id());
    const std::string what = absl::StrCat(c.name, ", ", c.optimizer);
    ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED)
        << what << ": " << done.failure_reason() << "\n" << ReadFile(coordinator.log_path());
    const fitrun::v1::Plan& plan = done.plan();
    EXPECT_FALSE(peaks.out_of_memory) << what;
    EXPECT_GT(plan.grad_accum_steps(), 1) << what << ": the global batch should not fit in one pass";
    EXPECT_EQ(peaks.ranks, 2) << what;
    EXPECT_LE(peaks.highest, cap) << what;
    EXPECT_GE(peaks.highest, 0.8 * cap) << what << ": planned " << plan.ShortDebugString();
    absl::StrAppend(&table, absl::StrFormat("%s: %d MiB, %d x %d, %.2f MiB, %.2f MiB, %.1f%%\n", what, c.cap_mib,
                                            plan.per_device_batch(), plan.grad_accum_steps(),
                                            plan.predicted().total_bytes() / 1048576.0, peaks.highest / 1048576.0,
                                            100.0 * peaks.highest / cap));
  }
  std::printf("%s", table.c_str());
}

fitrun::v1::Plan PlanOf(RunningCoordinator& coordinator, const std::string& spec_yaml) {
  grpc::ClientContext context;
  fitrun::v1::PlanJobRequest request;
  request.set_spec_yaml(spec_yaml);
  fitrun::v1::PlanJobResponse response;
  const grpc::Status status = coordinator.stub().PlanJob(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.plan();
}

int64_t Unmargined(const fitrun::v1::Plan& plan) {
  return plan.predicted().total_bytes() - plan.predicted().safety_margin_bytes();
}

// fitrund learns from every run: a calibration on disk that says the mlp needs half of what it
// does (as a stale or doctored cache would) plans too little; the first job's measured peaks correct
// it, and the next plan of the same workload covers what that job really took.
TEST(MemoryTest, AWrongStoredCalibrationIsCorrectedByOneJob) {
  // Devices small enough that the analytic estimate is tight, so the first job's workload is swept.
  RunningCoordinator coordinator("learns", "cpu:2x96MiB");
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  const std::string spec = MlpSpecYaml("learns", 3);
  absl::StatusOr<fitrun::v1::Job> first = coordinator.Submit(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  coordinator.Watch(first->id());
  ASSERT_EQ(coordinator.Get(first->id()).state(), fitrun::v1::JOB_STATE_SUCCEEDED) << ReadFile(coordinator.log_path());

  // Halve every peak the sweep measured, and forget the run that agreed with them.
  coordinator.Stop();
  const std::string cache = coordinator.state_dir() + "/memory_calibration.tsv";
  std::string doctored;
  const std::vector<std::string> lines = absl::StrSplit(ReadFile(cache), '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    if (fields[0] != "sweep") continue;
    std::vector<std::string> halved;
    const std::vector<std::string> points = absl::StrSplit(fields[3], ',');
    for (const std::string& point : points) {
      const std::pair<std::string, std::string> parts = absl::StrSplit(point, ':');
      halved.push_back(absl::StrCat(parts.first, ":", std::stoll(parts.second) / 2));
    }
    fields[3] = absl::StrJoin(halved, ",");
    absl::StrAppend(&doctored, absl::StrJoin(fields, "\t"), "\n");
  }
  ASSERT_FALSE(doctored.empty()) << ReadFile(cache);
  std::ofstream(cache, std::ios::trunc) << doctored;
  ASSERT_TRUE(coordinator.Restart()) << ReadFile(coordinator.log_path());

  const fitrun::v1::Plan wrong = PlanOf(coordinator, spec);
  absl::StatusOr<fitrun::v1::Job> second = coordinator.Submit(spec);
  ASSERT_TRUE(second.ok()) << second.status();
  const Peaks peaks = PeaksOf(coordinator.Watch(second->id()));
  const fitrun::v1::Job ran = coordinator.Get(second->id());
  ASSERT_EQ(ran.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << ReadFile(coordinator.log_path());
  EXPECT_EQ(ran.plan().per_device_batch(), wrong.per_device_batch());
  EXPECT_EQ(ran.plan().predicted().total_bytes(), wrong.predicted().total_bytes());
  EXPECT_GT(peaks.highest, wrong.predicted().total_bytes()) << "the doctored calibration plans too little";
  // The attempt keeps what it measured against what was promised.
  EXPECT_TRUE(WaitFor([&] { return coordinator.Get(second->id()).attempt_history(0).measured_peak_bytes() > 0; },
                      absl::Seconds(10)));
  EXPECT_EQ(coordinator.Get(second->id()).attempt_history(0).measured_peak_bytes(), peaks.highest);

  const fitrun::v1::Plan corrected = PlanOf(coordinator, spec);
  EXPECT_EQ(corrected.per_device_batch(), wrong.per_device_batch());
  EXPECT_GE(Unmargined(corrected), peaks.highest);
  std::string reasons;
  for (const std::string& r : corrected.reasons()) absl::StrAppend(&reasons, r, "\n");
  EXPECT_THAT(reasons, HasSubstr("real runs peaked at up to"));
  std::printf("per-device batch %lld: the doctored calibration predicted %.2f MiB, the run peaked at %.2f MiB, "
              "the next plan predicts %.2f MiB\n",
              static_cast<long long>(wrong.per_device_batch()), wrong.predicted().total_bytes() / 1048576.0,
              peaks.highest / 1048576.0, corrected.predicted().total_bytes() / 1048576.0);
  // And the estimator's error is on /metrics: one observation per rank (of this fitrund's one job),
  // both above 1.1 (the plan promised too little).
  const std::string metrics = coordinator.Metrics();
  EXPECT_THAT(metrics, HasSubstr("fitrun_memory_prediction_ratio_count 2"));
  EXPECT_THAT(metrics, HasSubstr("fitrun_memory_prediction_ratio_bucket{le=\"1.1\"} 0"));
}

// The first submit of a workload never seen before answers at once: when its plan is tight, its
// memory probe runs on fitrund's own thread while the job waits, and a user who submits once has
// exactly one job; when the analytic estimate fits with room to spare, no probe runs at all.
TEST(MemoryTest, TheFirstSubmitOfANewWorkloadDoesNotWaitForItsProbeWhichRunsOnlyWhenMemoryIsTight) {
  // cnn + Adam at 32 per rank: 91.7 MiB by the analytic estimate, over half of the 144 MiB usable.
  RunningCoordinator coordinator("first-submit", "cpu:2x160MiB");
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  const std::string spec_path = coordinator.state_dir() + "/cnn-adam.yaml";
  std::ofstream(spec_path) << "name: cnn-adam\n"
                              "model: {builtin: cnn}\n"
                              "data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
                              "optimizer: {kind: adam, lr: 0.001}\n"
                              "global_batch_size: 64\nmax_steps: 2\n"
                              "resources: {min_devices: 2, max_devices: 2}\n";
  const absl::Time start = absl::Now();
  const CommandResult cli =
      RunCommand({Runfile("client/fitrun"), "--coordinator=" + coordinator.address(), "submit", spec_path});
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_THAT(cli.out, HasSubstr("submitted job j-000001"));
  std::printf("fitrun submit of a new workload (cnn, adam) answered in %.3f s\n", absl::ToDoubleSeconds(took));

  grpc::ClientContext context;
  fitrun::v1::ListJobsResponse list;
  ASSERT_TRUE(coordinator.stub().ListJobs(&context, {}, &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  // It was accepted before its workload was measured, and it waited in PLANNING for the probe.
  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(list.jobs(0).id());
  std::string reasons;
  for (const fitrun::v1::JobEvent& e : events) {
    if (e.has_state_changed()) absl::StrAppend(&reasons, e.state_changed().reason(), "\n");
  }
  EXPECT_THAT(reasons, HasSubstr("submitted; its workload's memory is measured first"));
  EXPECT_THAT(reasons, HasSubstr("measuring memory: fitrun-worker --probe"));
  EXPECT_EQ(coordinator.Get(list.jobs(0).id()).state(), fitrun::v1::JOB_STATE_SUCCEEDED)
      << ReadFile(coordinator.log_path());
  EXPECT_THAT(coordinator.Metrics(), HasSubstr("fitrun_memory_probe_seconds_count 1"));

  // The mlp, never seen either, is far from tight: it launches at once, and its plan says why.
  absl::StatusOr<fitrun::v1::Job> roomy = coordinator.Submit(MlpSpecYaml("roomy", 2));
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  coordinator.Watch(roomy->id());
  const fitrun::v1::Job done = coordinator.Get(roomy->id());
  EXPECT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << ReadFile(coordinator.log_path());
  EXPECT_THAT(absl::StrJoin(done.plan().reasons(), "\n"), HasSubstr("no memory probe: the analytic estimate"));
  EXPECT_THAT(coordinator.Metrics(), HasSubstr("fitrun_memory_probe_seconds_count 1"));
}

// A GPT-2-small-shaped gpt (12 x 768, context 256, AdamW, fp32: 85.6 million parameters, 1.28 GiB of
// weights, gradients and moments) on two 1700 MiB devices: keeping every state on every rank does not fit
// even one sample, so the planner shards the optimizer states, and the run's losses are those of plain
// DDP on roomier devices. The activations are kept (recomputing them would fit one sample unsharded).
std::string Gpt2SmallSpec(const std::string& name, const std::string& text_path, const std::string& extra) {
  return absl::StrCat("name: ", name, R"(
model:
  builtin: gpt
  gpt: {layers: 12, heads: 12, hidden: 768, context: 256, activation_checkpointing: false}
data: {kind: text, path: )", text_path, R"(}
optimizer: {kind: adamw, lr: 0.0003, weight_decay: 0.01, lr_scaling: none}
global_batch_size: 2
max_steps: 4
precision: fp32
seed: 1
resources: {min_devices: 2, max_devices: 2}
)", extra);
}

// Step -> the global loss reported for it (the last attempt's, where a step ran twice).
std::map<int64_t, double> LossesOf(const std::vector<fitrun::v1::JobEvent>& events) {
  std::map<int64_t, double> losses;
  for (const fitrun::v1::JobEvent& event : events) {
    if (event.has_progress()) losses[event.progress().step()] = event.progress().loss();
  }
  return losses;
}

TEST(MemoryTest, ShardedOptimizerStatesTrainAModelWhoseStatesDoNotFitAsPlainDdpDoes) {
  const std::string text = WriteText("gpt2-small-text.txt", 40000);
  std::map<int64_t, double> plain_losses;
  {
    RunningCoordinator roomy("memory-roomy", "cpu:2x4GiB");
    ASSERT_TRUE(roomy.ok()) << ReadFile(roomy.log_path());
    absl::StatusOr<fitrun::v1::Job> job = roomy.Submit(Gpt2SmallSpec("gpt2-plain", text, "ddp: {zero_stage: 0}\n"));
    ASSERT_TRUE(job.ok()) << job.status();
    plain_losses = LossesOf(roomy.Watch(job->id()));
    const fitrun::v1::Job done = roomy.Get(job->id());
    ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason();
    EXPECT_EQ(done.plan().zero_stage(), 0);
  }
  ASSERT_EQ(plain_losses.size(), 4u);

  RunningCoordinator tight("memory-tight", "cpu:2x1700MiB");
  ASSERT_TRUE(tight.ok()) << ReadFile(tight.log_path());
  // Forbidden to shard, it does not fit.
  absl::StatusOr<fitrun::v1::Job> unsharded = tight.Submit(Gpt2SmallSpec("gpt2-unsharded", text, "ddp: {zero_stage: 0}\n"));
  ASSERT_TRUE(unsharded.ok()) << unsharded.status();
  tight.Watch(unsharded->id());
  const fitrun::v1::Job refused = tight.Get(unsharded->id());
  EXPECT_EQ(refused.state(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(refused.failure_reason(), HasSubstr("even per-device batch 1 needs"));

  absl::StatusOr<fitrun::v1::Job> job = tight.Submit(Gpt2SmallSpec("gpt2-sharded", text, ""));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<fitrun::v1::JobEvent> events = tight.Watch(job->id());
  const fitrun::v1::Job done = tight.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << "\n"
                                                           << ReadFile(tight.log_path());
  EXPECT_EQ(done.plan().zero_stage(), 1);
  EXPECT_EQ(done.plan().per_device_batch(), 1);
  EXPECT_THAT(absl::StrJoin(done.plan().reasons(), "\n"),
              HasSubstr("zero_stage: 1, optimizer states sharded over the 2 ranks"));
  EXPECT_THAT(absl::StrJoin(done.plan().reasons(), "\n"), HasSubstr("because without them even per-device batch 1 needs"));
  const Peaks peaks = PeaksOf(events);
  EXPECT_LE(peaks.highest, 1700LL << 20);
  std::printf("sharded: predicted %lld bytes, highest rank peak %lld bytes\n",
              static_cast<long long>(done.plan().predicted().total_bytes()), static_cast<long long>(peaks.highest));

  const std::map<int64_t, double> losses = LossesOf(events);
  ASSERT_EQ(losses.size(), plain_losses.size());
  for (const auto& [step, loss] : plain_losses) {
    EXPECT_NEAR(losses.at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
}

// What a rank holds on a CPU device is what its LibTorch tensors take (the capped allocator's count,
// which the device's memory is). The gradients are the all-reduce's flat buckets, summed in place,
// through shared memory slots or over Gloo, whose ring scratch (two segments of a bucket / 2n each)
// is plain heap outside that allocator, in the rank's host memory. So one rank peaks where the
// one-process probe does, and more ranks or the other transport add nothing: a plan made from the
// probe is never below a multi-rank run.
TEST(MemoryTest, ARankPeaksAtTheSameBytesWhateverTheWorldSizeAndWhatSumsTheGradients) {
  const std::string text = WriteText("memory-world-text.txt");
  struct Case {
    std::string name;
    int ranks;
    std::map<std::string, std::string> env;
    std::string ddp;
  };
  const std::vector<Case> cases = {
      {"one-rank", 1, {}, ""},
      {"three-ranks-shared-memory", 3, {}, ""},
      // Gloo with small buckets: many collectives in flight during backward.
      {"three-ranks-gloo", 3, {{"FITRUN_ALL_REDUCE", "gloo"}}, "ddp: {bucket_cap_mb: 0.05}\n"},
  };
  std::map<std::string, int64_t> peaks;
  for (const Case& c : cases) {
    RunningCoordinator coordinator(absl::StrCat("memory-", c.name), absl::StrCat("cpu:", c.ranks, "x64MiB"), c.env);
    ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
    std::string spec = GptSpec(c.name, text, absl::StrCat("{min_devices: ", c.ranks, ", max_devices: ", c.ranks,
                                                          ", per_device_batch: 4}\n", c.ddp));
    absl::StrReplaceAll({{"global_batch_size: 32", absl::StrCat("global_batch_size: ", 4 * c.ranks)}}, &spec);
    absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    const Peaks run = PeaksOf(coordinator.Watch(job->id()));
    const fitrun::v1::Job done = coordinator.Get(job->id());
    ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << c.name << ": " << done.failure_reason();
    ASSERT_EQ(run.ranks, c.ranks);
    peaks[c.name] = run.highest;
    std::printf("%s: highest rank peak %lld bytes\n", c.name.c_str(), static_cast<long long>(run.highest));
  }
  EXPECT_GT(peaks["one-rank"], 0);
  EXPECT_EQ(peaks["three-ranks-shared-memory"], peaks["one-rank"]);
  EXPECT_EQ(peaks["three-ranks-gloo"], peaks["one-rank"]);
}

// The small gpt on two 8 MiB devices with `strategy` in its spec, an out-of-memory error injected into
// rank 1 at step 4 and checkpoints every 2 steps: it must re-plan a smaller batch and resume from the
// checkpoint of step 2 (every rank's share of it, where the states are sharded). The finished job.
fitrun::v1::Job RunThroughAnInjectedOutOfMemory(const std::string& name,
                                                const std::vector<std::pair<std::string, std::string>>& strategy) {
  RunningCoordinator coordinator(absl::StrCat("memory-", name), kSmallDevices);
  EXPECT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  const std::string text = WriteText(absl::StrCat(name, "-text.txt"));
  std::string spec = GptSpec(name, text, "{min_devices: 2, max_devices: 2}");
  absl::StrReplaceAll({{"fault_tolerance: {max_oom_retries: 0, max_restarts: 0}",
                        "fault_tolerance: {max_oom_retries: 1, max_restarts: 0}\n"
                        "fault_injection: {kind: oom, rank: 1, at_step: 4}\n"
                        "checkpoint: {every_steps: 2}"}},
                      &spec);
  absl::StrReplaceAll(strategy, &spec);
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(spec);
  if (!job.ok()) {
    ADD_FAILURE() << job.status();
    return {};
  }
  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  EXPECT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << "\n"
                                                           << ReadFile(coordinator.log_path());
  EXPECT_EQ(done.attempt_history_size(), 2);
  if (done.attempt_history_size() == 2) {
    // A smaller batch, or the same one recomputing activations where the first attempt kept them.
    const int64_t before = done.attempt_history(0).per_device_batch();
    const int64_t after = done.attempt_history(1).per_device_batch();
    const bool now_recomputing = done.oom_history_size() > 0 && !done.oom_history(0).activation_checkpointing() &&
                                 done.plan().activation_checkpointing();
    EXPECT_TRUE(after < before || (after == before && now_recomputing))
        << "per-device batch " << before << " ran out of memory, then " << after
        << (done.plan().activation_checkpointing() ? " recomputing" : "");
  }
  bool resumed = false;
  bool out_of_memory = false;
  for (const fitrun::v1::JobEvent& event : events) {
    out_of_memory |= event.has_oom();
    resumed |= event.has_log() && event.log().text().find("resumed from the checkpoint of step 2") != std::string::npos;
  }
  EXPECT_TRUE(out_of_memory);
  EXPECT_TRUE(resumed);
  return done;
}

TEST(MemoryTest, ASpecShardedRunThatRunsOutOfMemoryReplansAndResumes) {
  const fitrun::v1::Job done = RunThroughAnInjectedOutOfMemory(
      "gpt-sharded-oom", {{"checkpoint: {every_steps: 2}", "checkpoint: {every_steps: 2}\nddp: {zero_stage: 1}"}});
  EXPECT_EQ(done.plan().zero_stage(), 1);
}

// GptSpec's gpt at 8 layers, whose activations dominate: keeping them, one sample peaks at 9.4 MiB, over
// a 10 MiB device's 9 MiB usable; recomputing each block's in backward, two samples take 7.8 MiB.
std::string EightLayerGptSpec(const std::string& name, const std::string& text_path, const std::string& gpt_extra,
                              const std::string& resources) {
  return absl::StrReplaceAll(GptSpec(name, text_path, resources),
                             {{"layers: 2", "layers: 8"},
                              {"context: 64}", absl::StrCat("context: 64", gpt_extra, "}")},
                              {"global_batch_size: 32", "global_batch_size: 16"},
                              {"max_steps: 5", "max_steps: 4"}});
}

// The spec leaves activation checkpointing to the plan: both models are measured, and on a device where
// only recomputing fits, the plan recomputes, the ranks build the model that does, and the run's losses
// are the ones of a run that keeps its activations on a roomier device.
TEST(MemoryTest, AModelThatFitsOnlyByRecomputingItsActivationsIsPlannedSoAndTrainsTheSameNumbers) {
  const std::string text = WriteText("memory-recompute-text.txt");
  std::map<int64_t, double> kept_losses;
  {
    RunningCoordinator roomy("memory-recompute-roomy", "cpu:1x64MiB");
    ASSERT_TRUE(roomy.ok()) << ReadFile(roomy.log_path());
    absl::StatusOr<fitrun::v1::Job> job = roomy.Submit(
        EightLayerGptSpec("kept", text, ", activation_checkpointing: false", "{per_device_batch: 2}"));
    ASSERT_TRUE(job.ok()) << job.status();
    kept_losses = LossesOf(roomy.Watch(job->id()));
    const fitrun::v1::Job done = roomy.Get(job->id());
    ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason();
    EXPECT_FALSE(done.plan().activation_checkpointing());
  }
  ASSERT_EQ(kept_losses.count(4), 1u);

  RunningCoordinator tight("memory-recompute-tight", "cpu:1x10MiB");
  ASSERT_TRUE(tight.ok()) << ReadFile(tight.log_path());
  // Forbidden to recompute, nothing fits.
  absl::StatusOr<fitrun::v1::Job> forbidden =
      tight.Submit(EightLayerGptSpec("forbidden", text, ", activation_checkpointing: false", "{min_devices: 1}"));
  ASSERT_TRUE(forbidden.ok()) << forbidden.status();
  tight.Watch(forbidden->id());
  const fitrun::v1::Job refused = tight.Get(forbidden->id());
  EXPECT_EQ(refused.state(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(refused.failure_reason(), HasSubstr("even per-device batch 1 needs"));

  absl::StatusOr<fitrun::v1::Job> job = tight.Submit(EightLayerGptSpec("chosen", text, "", "{min_devices: 1}"));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<fitrun::v1::JobEvent> events = tight.Watch(job->id());
  const fitrun::v1::Job done = tight.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << "\n"
                                                           << ReadFile(tight.log_path());
  EXPECT_TRUE(done.plan().activation_checkpointing());
  const std::string reasons = absl::StrJoin(done.plan().reasons(), "\n");
  EXPECT_THAT(reasons, HasSubstr("activation_checkpointing: each block's activations recomputed in backward"));
  EXPECT_THAT(reasons, HasSubstr("because without it even per-device batch 1 needs"));
  EXPECT_THAT(reasons, HasSubstr("memory estimate: calibrated"));
  const Peaks peaks = PeaksOf(events);
  EXPECT_FALSE(peaks.out_of_memory);
  EXPECT_LE(peaks.highest, 10LL << 20);
  std::printf("recomputing: per-device batch %lld, predicted %lld bytes, highest rank peak %lld bytes\n",
              static_cast<long long>(done.plan().per_device_batch()),
              static_cast<long long>(done.plan().predicted().total_bytes()), static_cast<long long>(peaks.highest));
  // Fast steps are reported at intervals: every step both runs reported, and the last, compare.
  const std::map<int64_t, double> losses = LossesOf(events);
  ASSERT_EQ(losses.count(4), 1u);
  int compared = 0;
  for (const auto& [step, loss] : kept_losses) {
    if (losses.count(step) == 0) continue;
    EXPECT_NEAR(losses.at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
    ++compared;
  }
  EXPECT_GE(compared, 1);
}

// Likewise for a run that recomputes its activations: the re-plan still recomputes, and the lesson is
// held against the recomputing model's figures.
TEST(MemoryTest, ARecomputingRunThatRunsOutOfMemoryReplansAndResumes) {
  const fitrun::v1::Job done = RunThroughAnInjectedOutOfMemory(
      "gpt-recompute-oom", {{"context: 64}", "context: 64, activation_checkpointing: true}"}});
  EXPECT_TRUE(done.plan().activation_checkpointing());
  ASSERT_EQ(done.oom_history_size(), 1);
  EXPECT_TRUE(done.oom_history(0).activation_checkpointing());
}

}  // namespace
}  // namespace fitrun::testing
