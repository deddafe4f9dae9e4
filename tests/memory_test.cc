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

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/coordinator.h"

namespace fitrun::testing {
namespace {

using ::testing::HasSubstr;

// Two devices of 8 MiB: the 2-layer GPT's 16 samples per rank per step do not fit in one pass
// (about 17 MB), 4 do (about 6.3 MB).
constexpr char kSmallDevices[] = "cpu:2x8MiB";

// 6400 bytes of words: 89 training windows of 64 bytes and 9 test windows (so rank 0's final
// evaluation, which runs after training at up to 1000 windows at once, stays small).
std::string WriteText(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = (std::filesystem::path(dir != nullptr ? dir : "/tmp") / name).string();
  static const char* kWords[] = {"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with"};
  std::mt19937 random(1);
  std::string text;
  while (text.size() < 6400) absl::StrAppend(&text, kWords[random() % 12], " ");
  text.resize(6400);
  std::ofstream(path) << text;
  return path;
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

}  // namespace
}  // namespace fitrun::testing
