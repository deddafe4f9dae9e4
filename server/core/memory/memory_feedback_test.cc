#include "server/core/memory/memory_feedback.h"
#include "server/core/specs/workloads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "server/core/specs/test_specs.h"

namespace fitrun::server {
namespace {

constexpr int64_t kMiB = 1LL << 20;
using ::testing::HasSubstr;

fitrun::v1::JobSpec MlpSpec() { return MlpTestSpec(256, 2, 2); }

fitrun::v1::OutOfMemory Oom(int64_t batch, int64_t live, int64_t requested, int64_t cap) {
  fitrun::v1::OutOfMemory oom;
  oom.set_per_device_batch(batch);
  oom.set_live_bytes(live);
  oom.set_requested_bytes(requested);
  oom.set_peak_bytes(live);
  oom.set_cap_bytes(cap);
  return oom;
}

TEST(MemoryFeedbackTest, NoHistoryChangesNothing) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  const ModelProfile model = *ProfileFor(spec);
  OutOfMemoryHistory history;
  EXPECT_EQ(LimitsAfterOutOfMemory(history).max_per_device_batch, 0);
  EXPECT_EQ(ProfileAfterOutOfMemory(model, spec, history, {}).activation_bytes_per_sample,
            model.activation_bytes_per_sample);
}

TEST(MemoryFeedbackTest, LimitIsBelowTheSmallestBatchThatRanOut) {
  OutOfMemoryHistory history;
  *history.Add() = Oom(128, 0, 0, 0);
  *history.Add() = Oom(64, 0, 0, 0);
  EXPECT_EQ(LimitsAfterOutOfMemory(history).max_per_device_batch, 63);
  OutOfMemoryHistory at_one;
  *at_one.Add() = Oom(1, 0, 0, 0);
  EXPECT_EQ(LimitsAfterOutOfMemory(at_one).max_per_device_batch, 1);  // never "no bound"
}

// Ranks that ran out at a batch bound their own form below it, and the other form at it: recomputing
// may still take the batch keeping failed at, but no form takes a larger batch after an error.
TEST(MemoryFeedbackTest, EachFormIsBoundedBelowItsOwnErrorsAndAtTheOthers) {
  OutOfMemoryHistory history;
  fitrun::v1::OutOfMemory recomputing = Oom(8, 0, 0, 0);
  recomputing.set_activation_checkpointing(true);
  *history.Add() = recomputing;
  PlanLimits limits = LimitsAfterOutOfMemory(history);
  EXPECT_EQ(limits.MaxPerDeviceBatch(/*recomputing=*/true), 7);
  EXPECT_EQ(limits.MaxPerDeviceBatch(/*recomputing=*/false), 8);
  *history.Add() = Oom(2, 0, 0, 0);
  limits = LimitsAfterOutOfMemory(history);
  EXPECT_EQ(limits.MaxPerDeviceBatch(/*recomputing=*/false), 1);
  EXPECT_EQ(limits.MaxPerDeviceBatch(/*recomputing=*/true), 2) << "keeping failed at 2: recomputing may take 2";
}

TEST(MemoryFeedbackTest, EstimateAtTheFailedBatchCoversWhatWasMeasured) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  const ModelProfile model = *ProfileFor(spec);
  const int64_t predicted = EstimateRankMemory(model, spec, 128).total_bytes();
  OutOfMemoryHistory history;
  *history.Add() = Oom(128, /*live=*/predicted, /*requested=*/64 * kMiB, /*cap=*/predicted + kMiB);
  const ModelProfile corrected = ProfileAfterOutOfMemory(model, spec, history, {});
  EXPECT_GT(corrected.activation_bytes_per_sample, model.activation_bytes_per_sample);
  const fitrun::v1::MemoryBreakdown after = EstimateRankMemory(corrected, spec, 128);
  EXPECT_GE(after.total_bytes() - after.safety_margin_bytes(), predicted + 64 * kMiB);
  // Only the per-sample part moved: weights and the rest are what they were.
  EXPECT_EQ(after.weights_bytes(), EstimateRankMemory(model, spec, 128).weights_bytes());
}

TEST(MemoryFeedbackTest, ACalibratedCurvesPerSamplePartIsScaledToCoverWhatWasMeasured) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  ModelProfile model = *ProfileFor(spec);
  std::vector<MeasuredPeak> points;
  for (int64_t b = 1; b <= 128; b *= 2) points.push_back({b, MlpPeakBytes(b)});
  model.measured = MemoryCurve(points);
  // The run at 128 needed twice what the curve adds over its fixed part there.
  const int64_t fixed = model.measured->FixedBytes();
  const int64_t needed = fixed + 2 * (MlpPeakBytes(128) - fixed);
  OutOfMemoryHistory history;
  *history.Add() = Oom(128, /*live=*/needed - kMiB, /*requested=*/kMiB, /*cap=*/needed);
  const ModelProfile corrected = ProfileAfterOutOfMemory(model, spec, history, {});
  const fitrun::v1::MemoryBreakdown after = EstimateRankMemory(corrected, spec, 128);
  EXPECT_GE(after.total_bytes() - after.safety_margin_bytes(), needed);
  // Smaller batches grow by the same per-sample factor, so half the batch still fits where a
  // scaling of the whole curve would have ruled everything out.
  EXPECT_NEAR(corrected.measured->PeakAt(64) - fixed, 2.0 * (MlpPeakBytes(64) - fixed), 2);
  EXPECT_EQ(corrected.measured->FixedBytes(), fixed);
  EXPECT_NE(corrected.memory_source.find("per-sample part scaled by 2.00"), std::string::npos);
}

// A rank whose optimizer states were sharded needed less than whole states would have: what it
// needed is held against the sharded estimate, so the curve learns the whole shortfall.
TEST(MemoryFeedbackTest, AShardedRunsNeedIsHeldAgainstTheShardedEstimate) {
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAMW);
  ModelProfile model = *ProfileFor(spec);
  model.parameter_count = 10'000'000;  // 38 MiB a copy: sharding the moments over 2 ranks saves 38 MiB
  model.measured = MemoryCurve({{1, 200 * kMiB}, {256, 455 * kMiB}});
  const fitrun::v1::MemoryBreakdown sharded = EstimateRankMemory(model, spec, 64, {}, {}, 2);
  const int64_t needed = sharded.total_bytes() - sharded.safety_margin_bytes() + 20 * kMiB;
  OutOfMemoryHistory history;
  *history.Add() = Oom(64, needed - kMiB, kMiB, needed);
  history.Mutable(0)->set_optimizer_state_shards(2);
  const ModelProfile corrected = ProfileAfterOutOfMemory(model, spec, history, {});
  const fitrun::v1::MemoryBreakdown after = EstimateRankMemory(corrected, spec, 64, {}, {}, 2);
  EXPECT_GE(after.total_bytes() - after.safety_margin_bytes(), needed);
  // Held against whole states the same need is below the estimate and would teach nothing.
  history.Mutable(0)->set_optimizer_state_shards(0);
  EXPECT_EQ(ProfileAfterOutOfMemory(model, spec, history, {}).measured->PeakAt(64), model.measured->PeakAt(64));
}

// A rank that recomputed its activations ran the other model: its need corrects that model's
// figures, and one that kept them corrects the plain model's, whichever the plan weighs next.
TEST(MemoryFeedbackTest, AnErrorTeachesTheModelTheRankRanNotItsAlternative) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  ModelProfile model = *ProfileFor(spec);
  model.measured = MemoryCurve({{1, 20 * kMiB}, {256, 275 * kMiB}});
  ModelProfile recomputing = model;
  recomputing.activation_checkpointing = true;
  recomputing.measured = MemoryCurve({{1, 10 * kMiB}, {256, 74 * kMiB}});
  model.recomputing = std::make_shared<const ModelProfile>(recomputing);
  const fitrun::v1::MemoryBreakdown before = EstimateRankMemory(recomputing, spec, 64);
  const int64_t needed = before.total_bytes() - before.safety_margin_bytes() + 20 * kMiB;
  OutOfMemoryHistory history;
  *history.Add() = Oom(64, needed - kMiB, kMiB, needed);
  history.Mutable(0)->set_activation_checkpointing(true);
  const ModelProfile corrected = ProfileAfterOutOfMemory(model, spec, history, {});
  EXPECT_EQ(corrected.measured->PeakAt(64), model.measured->PeakAt(64));
  ASSERT_NE(corrected.recomputing, nullptr);
  const fitrun::v1::MemoryBreakdown after = EstimateRankMemory(*corrected.recomputing, spec, 64);
  EXPECT_GE(after.total_bytes() - after.safety_margin_bytes(), needed);
}

TEST(MemoryFeedbackTest, OutOfMemoryBelowTheEstimateLeavesTheEstimateAlone) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  const ModelProfile model = *ProfileFor(spec);
  OutOfMemoryHistory history;
  *history.Add() = Oom(128, 1 * kMiB, 1 * kMiB, 2 * kMiB);  // a device far smaller than planned for
  EXPECT_EQ(ProfileAfterOutOfMemory(model, spec, history, {}).activation_bytes_per_sample,
            model.activation_bytes_per_sample);
}

TEST(MemoryFeedbackTest, ReplanAfterOutOfMemoryHalvesTheBatchAndKeepsTheGlobalBatch) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  const ModelProfile model = *ProfileFor(spec);
  const int64_t cap = 256 * kMiB;
  OutOfMemoryHistory history;
  // At batch 128 the rank held 200 MiB and asked for 60 MiB more than a 256 MiB device has.
  *history.Add() = Oom(128, 200 * kMiB, 60 * kMiB, cap);
  const ModelProfile corrected = ProfileAfterOutOfMemory(model, spec, history, {});
  absl::StatusOr<fitrun::v1::Plan> plan =
      PlanJob(spec, corrected, {{"cpu:0", cap}, {"cpu:1", cap}}, {}, LimitsAfterOutOfMemory(history));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LT(plan->per_device_batch(), 128);
  EXPECT_EQ(plan->device_ids_size() * plan->per_device_batch() * plan->grad_accum_steps(), 256);
  EXPECT_LE(plan->predicted().total_bytes(), cap);
}

// A script nothing measured before it ran out of memory: what it needed is all there is, taken as
// growing with the batch, and the plan after it is held against that.
TEST(MemoryFeedbackTest, AnUnmeasuredScriptIsBoundedByWhatItsOutOfMemoryErrorNeeded) {
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.clear_model();
  spec.mutable_script()->add_command("train.py");
  const ModelProfile unmeasured = *ProfileFor(spec);
  ASSERT_TRUE(unmeasured.Unmeasured());
  const int64_t cap = 256 * kMiB;
  OutOfMemoryHistory history;
  *history.Add() = Oom(128, 200 * kMiB, 60 * kMiB, cap);
  const ModelProfile corrected = ProfileAfterOutOfMemory(unmeasured, spec, history, {});
  EXPECT_FALSE(corrected.Unmeasured());
  EXPECT_THAT(corrected.memory_source, HasSubstr("ran out of memory at micro-batch 128 needing at least 260.0 MiB"));
  absl::StatusOr<fitrun::v1::Plan> plan =
      PlanJob(spec, corrected, {{"cpu:0", cap}, {"cpu:1", cap}}, {}, LimitsAfterOutOfMemory(history));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 64) << "260 MiB for 128 samples: 64 is predicted to fit 256 MiB";
  EXPECT_GT(plan->predicted().total_bytes(), 130 * kMiB);
  EXPECT_LE(plan->predicted().total_bytes(), cap);
}

}  // namespace
}  // namespace fitrun::server
