// The planner's strategies: the estimator's breakdown, sharding the optimizer states (ZeRO-1), and
// recomputing activations against accumulating, each where it fits or buys a batch.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>

#include "absl/strings/str_join.h"
#include "server/core/memory/planner.h"
#include "server/core/memory/planner_testing.h"
#include "server/core/specs/job_specs.h"
#include "server/core/specs/workloads.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

TEST(EstimatorTest, BreakdownAddsUpAndCountsOptimizerState) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  const ModelProfile model = Profile(spec);
  EXPECT_EQ(model.parameter_count, 669706);  // 784*512+512 + 512*512+512 + 512*10+10
  fitrun::v1::MemoryBreakdown m = EstimateRankMemory(model, spec, 64);
  EXPECT_EQ(m.weights_bytes(), 669706 * 4);
  EXPECT_EQ(m.gradients_bytes(), m.weights_bytes());
  EXPECT_EQ(m.optimizer_state_bytes(), m.weights_bytes());  // SGD momentum: one buffer
  EXPECT_EQ(m.total_bytes(), m.weights_bytes() + m.gradients_bytes() + m.optimizer_state_bytes() +
                                 m.ddp_buckets_bytes() + m.activations_bytes() + m.workspace_bytes() +
                                 m.framework_overhead_bytes() + m.safety_margin_bytes());

  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAM);
  spec.mutable_optimizer()->set_momentum(0);
  EXPECT_EQ(EstimateRankMemory(model, spec, 64).optimizer_state_bytes(), 2 * m.weights_bytes());
}

// A communication hook's working memory (compressed copies, PowerSGD's error feedback) is counted
// with the DDP buckets; the plain all-reduce needs only the loss slot beside the gradients.
TEST(EstimatorTest, CommunicationHooksAddTheirWorkingMemoryToTheBuckets) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  const ModelProfile model = Profile(spec);
  EXPECT_EQ(EstimateRankMemory(model, spec, 64).ddp_buckets_bytes(), 4);
  for (fitrun::v1::CommHook hook :
       {fitrun::v1::COMM_HOOK_FP16, fitrun::v1::COMM_HOOK_BF16, fitrun::v1::COMM_HOOK_POWERSGD}) {
    spec.mutable_ddp()->set_comm_hook(hook);
    const fitrun::v1::MemoryBreakdown m = EstimateRankMemory(model, spec, 64);
    EXPECT_EQ(m.ddp_buckets_bytes(), 4 + 12 * 669706) << fitrun::v1::CommHook_Name(hook);
    EXPECT_EQ(m.total_bytes(), m.weights_bytes() + m.gradients_bytes() + m.optimizer_state_bytes() +
                                   m.ddp_buckets_bytes() + m.activations_bytes() + m.workspace_bytes() +
                                   m.framework_overhead_bytes() + m.safety_margin_bytes());
  }
}

TEST(EstimatorTest, ActivationsGrowLinearlyWithBatch) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  const ModelProfile model = Profile(spec);
  const auto m1 = EstimateRankMemory(model, spec, 1);
  const auto m8 = EstimateRankMemory(model, spec, 8);
  EXPECT_EQ(m8.activations_bytes(), 8 * m1.activations_bytes());
  EXPECT_GT(m8.total_bytes(), m1.total_bytes());
}

// With the optimizer states sharded over n ranks a rank keeps 1/n of them: the states line shrinks by
// the rest, and so does the total, for an analytic profile and for a measured one (whose peak held
// every state).
TEST(EstimatorTest, ShardedOptimizerStatesAreOneRanksShare) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 4);
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAMW);
  ModelProfile model = Profile(spec);
  for (bool measured : {false, true}) {
    if (measured) model.measured = MemoryCurve({{1, 40 * kMiB}, {256, 300 * kMiB}});
    const fitrun::v1::MemoryBreakdown whole = EstimateRankMemory(model, spec, 64);
    for (int shards : {2, 4}) {
      const fitrun::v1::MemoryBreakdown share = EstimateRankMemory(model, spec, 64, {}, {}, shards);
      EXPECT_EQ(share.optimizer_state_bytes(), (whole.optimizer_state_bytes() + shards - 1) / shards);
      const int64_t saved = whole.optimizer_state_bytes() - share.optimizer_state_bytes();
      EXPECT_EQ(whole.total_bytes() - whole.safety_margin_bytes() - (share.total_bytes() - share.safety_margin_bytes()),
                saved)
          << shards << " shards, measured " << measured;
      EXPECT_EQ(share.activations_bytes(), whole.activations_bytes());
    }
  }
}

// A profile whose AdamW states (16 bytes a parameter with weights and gradients) do not fit one
// 130 MiB device beside the analytic 40 MiB of workspace and overhead (128 MiB at batch 1 with the
// margin), but do when two ranks share the moments (107 MiB).
ModelProfile StateHeavy(const fitrun::v1::JobSpec& spec) {
  ModelProfile p = Profile(spec);
  p.parameter_count = 5'000'000;  // 19.1 MiB a copy
  p.activation_bytes_per_sample = 16 << 10;
  return p;
}

fitrun::v1::JobSpec AdamWSpec(int64_t global_batch, int min_devices, int max_devices) {
  fitrun::v1::JobSpec spec = MlpSpec(global_batch, min_devices, max_devices);
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAMW);
  spec.mutable_optimizer()->set_momentum(0);
  return spec;
}

TEST(PlannerShardingTest, ShardsTheOptimizerStatesWhenOnlyThatFits) {
  const fitrun::v1::JobSpec spec = AdamWSpec(64, 2, 2);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, StateHeavy(spec), Devices(2, 130 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->zero_stage(), 1);
  EXPECT_EQ(plan->predicted().optimizer_state_bytes(), 5'000'000 * 4);  // two moments, halved
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"),
              HasSubstr("zero_stage: 1, optimizer states sharded over the 2 ranks ("));
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("because without them even per-device batch 1 needs"));

  // Forbidden, nothing fits, and the refusal says what sharding would have needed.
  fitrun::v1::JobSpec forbidden = spec;
  forbidden.mutable_ddp()->set_zero_stage(0);
  plan = PlanJob(forbidden, StateHeavy(forbidden), Devices(2, 130 * kMiB));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), ::testing::Not(HasSubstr("sharded")));
  plan = PlanJob(AdamWSpec(64, 2, 2), StateHeavy(spec), Devices(2, 100 * kMiB));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("with optimizer states sharded over 2 ranks"));
}

TEST(PlannerShardingTest, KeepsEveryStateOnEveryRankUnlessShardingBuysABatch) {
  const fitrun::v1::JobSpec spec = AdamWSpec(64, 2, 2);
  absl::StatusOr<fitrun::v1::Plan> roomy = PlanJob(spec, StateHeavy(spec), Devices(2, 1024 * kMiB));
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(roomy->zero_stage(), 0);
  EXPECT_EQ(roomy->per_device_batch(), 32);
  EXPECT_THAT(absl::StrJoin(roomy->reasons(), "\n"), ::testing::Not(HasSubstr("zero_stage")));

  // Pinned, it shards even where it buys nothing.
  fitrun::v1::JobSpec pinned = spec;
  pinned.mutable_ddp()->set_zero_stage(1);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(pinned, StateHeavy(pinned), Devices(2, 1024 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->zero_stage(), 1);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("because spec.ddp.zero_stage is 1"));
}

// Where halving the momentum fits twice the batch, sharding buys half the accumulation passes.
TEST(PlannerShardingTest, ShardsWhenThatFitsALargerBatch) {
  const fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  const ModelProfile model = Profile(spec);
  const int64_t needed_for_32 = EstimateRankMemory(model, spec, 32).total_bytes();
  const int64_t needed_for_64 = EstimateRankMemory(model, spec, 64).total_bytes();
  ASSERT_LE(EstimateRankMemory(model, spec, 64, {}, {}, 2).total_bytes(), (needed_for_32 + needed_for_64) / 2);
  const int64_t free_bytes = static_cast<int64_t>((needed_for_32 + needed_for_64) / 2 / 0.9);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, Devices(2, free_bytes));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->zero_stage(), 1);
  EXPECT_EQ(plan->per_device_batch(), 64);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"),
              HasSubstr("they fit per-device batch 64 where keeping every state on every rank fits 32 (2 instead of 4 "
                        "accumulation passes)"));
}

TEST(PlannerShardingTest, OneRankIsNeverSharded) {
  const fitrun::v1::JobSpec spec = AdamWSpec(64, 1, 1);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, StateHeavy(spec), Devices(1, 130 * kMiB));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), ::testing::Not(HasSubstr("sharded")));
}

// A calibrated model whose activations dominate (10 MiB a sample), with the same model recomputing
// them (2 MiB a sample) as the plan's alternative; recomputing adds 30% to a sample's compute.
ModelProfile WithRecomputingAlternative(const fitrun::v1::JobSpec& spec, std::vector<MeasuredStepTime> kept_times = {},
                                        std::vector<MeasuredStepTime> recomputing_times = {}) {
  ModelProfile p = Profile(spec);
  p.parameter_count = 1000;
  p.measured = MemoryCurve({{1, 11 * kMiB}, {256, 2561 * kMiB}});
  p.recompute_share = 0.3;
  p.step_times = std::move(kept_times);
  ModelProfile recomputing = p;
  recomputing.activation_checkpointing = true;
  recomputing.measured = MemoryCurve({{1, 3 * kMiB}, {256, 513 * kMiB}});
  recomputing.step_times = std::move(recomputing_times);
  p.recomputing = std::make_shared<const ModelProfile>(recomputing);
  return p;
}

// On 30 MiB (27 MiB usable) the kept activations fit per-device batch 2 of the 8, recomputed ones all 8.
TEST(PlannerStrategyTest, RecomputesWhenItsMeasuredStepsAreFasterThanAccumulating) {
  const fitrun::v1::JobSpec spec = MlpSpec(8, 1, 1);
  // Kept: 0.3 s a pass + 0.2 s a sample, so 4 x 0.7 = 2.8 s; recomputed: 0.3 + 8 x 0.26 = 2.38 s.
  const ModelProfile model = WithRecomputingAlternative(spec, {{1, 0.5}, {2, 0.7}, {8, 1.9}}, {{1, 0.56}, {8, 2.38}});
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, Devices(1, 30 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->activation_checkpointing());
  EXPECT_EQ(plan->per_device_batch(), 8);
  EXPECT_EQ(plan->grad_accum_steps(), 1);
  const std::string reasons = absl::StrJoin(plan->reasons(), "\n");
  EXPECT_THAT(reasons, HasSubstr("activation_checkpointing: each block's activations recomputed in backward"));
  // Timed steps are seconds: the job's samples a second, 8 / 2.38 s and 8 / 2.8 s.
  EXPECT_THAT(reasons, HasSubstr("strategy: activations recomputed, optimizer states whole, predicted the fastest of "
                                 "those that fit (3.4 samples/s predicted; activations kept, optimizer states whole at "
                                 "per-device batch 2 (4 passes, predicted peak 21.6 MiB): 1.18x the step time, 2.9 "
                                 "samples/s)"));
  EXPECT_THAT(reasons, HasSubstr("step time from the probe's timed steps, by micro-batch (1: 0.500 s, 2: 0.700 s, 8: "
                                 "1.900 s); recomputing (1: 0.560 s, 8: 2.380 s)"));

  // The recomputing model not timed itself: the kept model's time with 30% more of its per-sample
  // part, 1.9 + 0.3 x 1.6 = 2.38 s again.
  plan = PlanJob(spec, WithRecomputingAlternative(spec, {{1, 0.5}, {2, 0.7}, {8, 1.9}}), Devices(1, 30 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->activation_checkpointing());
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("1.18x the step time"));
}

TEST(PlannerStrategyTest, AccumulatesWhenAPassCostsNoMoreThanItsSamples) {
  const fitrun::v1::JobSpec spec = MlpSpec(8, 1, 1);
  // Untimed: 4 x 2 = 8 samples' compute against 8 x 1.3 = 10.4.
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, WithRecomputingAlternative(spec), Devices(1, 30 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->activation_checkpointing());
  EXPECT_EQ(plan->per_device_batch(), 2);
  EXPECT_EQ(plan->grad_accum_steps(), 4);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"),
              HasSubstr("(activations recomputed, optimizer states whole at per-device batch 8 (1 passes, predicted "
                        "peak 17.5 MiB): 1.30x the step time); step time not measured"));
  // Timed at 0.2 s a sample and nothing a pass: 4 x 0.4 = 1.6 s against 1.6 x 1.3 = 2.08 s.
  plan = PlanJob(spec, WithRecomputingAlternative(spec, {{1, 0.2}, {8, 1.6}}), Devices(1, 30 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->activation_checkpointing());
  // Where everything fits, both take one pass and keeping the activations is faster.
  plan = PlanJob(spec, WithRecomputingAlternative(spec, {{1, 0.5}, {8, 1.9}}, {{1, 0.56}, {8, 2.38}}),
                 Devices(1, 1024 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->activation_checkpointing());
  EXPECT_EQ(plan->per_device_batch(), 8);
}

TEST(PlannerStrategyTest, RecomputingTimedFasterAtTheSameBatchIsNotTakenAsFaster) {
  const fitrun::v1::JobSpec spec = MlpSpec(8, 1, 1);
  // The recomputing steps timed below the kept ones (noise, or a line extended past its points):
  // where both take one pass of 8, keeping the activations is no slower, and is kept.
  absl::StatusOr<fitrun::v1::Plan> plan =
      PlanJob(spec, WithRecomputingAlternative(spec, {{1, 0.5}, {8, 1.9}}, {{1, 0.4}, {8, 1.0}}), Devices(1, 1024 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->activation_checkpointing());
  EXPECT_EQ(plan->per_device_batch(), 8);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"),
              HasSubstr("at per-device batch 8 (1 passes, predicted peak 17.5 MiB): 1.00x the step time"));
  // Where only recomputing takes the batch in one pass, its own time still weighs against four passes.
  plan = PlanJob(spec, WithRecomputingAlternative(spec, {{1, 0.5}, {2, 0.7}, {8, 1.9}}, {{1, 0.4}, {8, 1.0}}),
                 Devices(1, 30 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->activation_checkpointing());
  EXPECT_EQ(plan->per_device_batch(), 8);
}

TEST(PlannerStrategyTest, RecomputesWhenOnlyThatFitsAndSaysWhatKeepingThemNeeds) {
  const fitrun::v1::JobSpec spec = MlpSpec(8, 1, 1);
  // 10 MiB: 9 MiB usable; kept, batch 1 needs 11.3 MiB; recomputed, batch 2 needs 5.2 MiB.
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, WithRecomputingAlternative(spec), Devices(1, 10 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->activation_checkpointing());
  EXPECT_EQ(plan->per_device_batch(), 2);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("because without it even per-device batch 1 needs 11.3 MiB"));

  // Nothing fits: the refusal says what each strategy needs at batch 1.
  plan = PlanJob(spec, WithRecomputingAlternative(spec), Devices(1, 3 * kMiB));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("even per-device batch 1 needs 11.3 MiB (3.1 MiB with activations recomputed, optimizer states whole)"));
}

TEST(PlannerStrategyTest, AModelThatRecomputesBecauseTheSpecSaysSoIsPlannedSo) {
  const fitrun::v1::JobSpec spec = MlpSpec(8, 1, 1);
  ModelProfile pinned = *WithRecomputingAlternative(spec).recomputing;
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, pinned, Devices(1, 1024 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->activation_checkpointing());
  const std::string reasons = absl::StrJoin(plan->reasons(), "\n");
  EXPECT_THAT(reasons, HasSubstr("because the spec's model config sets it"));
  EXPECT_THAT(reasons, ::testing::Not(HasSubstr("strategy:")));
  // And a model that keeps them is never told to recompute.
  ModelProfile forbidden = WithRecomputingAlternative(spec);
  forbidden.recomputing = nullptr;
  plan = PlanJob(spec, forbidden, Devices(1, 30 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->activation_checkpointing());
  EXPECT_EQ(plan->per_device_batch(), 2);
}

// A script that applies the plan's strategy: recomputing is weighed as the probe measured the script
// doing it; sharding is taken only where the spec pins it, with every state still counted.
TEST(PlannerStrategyTest, AScriptThatAppliesTheStrategyRecomputesWhereOnlyThatFitsAndShardsOnlyWhenPinned) {
  fitrun::v1::JobSpec spec = MlpSpec(16, 2, 2);
  spec.mutable_script()->add_command("/usr/bin/python3");
  spec.mutable_script()->add_command("train.py");
  spec.mutable_script()->set_applies_strategy(true);
  const ModelProfile model = WithRecomputingAlternative(spec);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, Devices(2, 10 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->activation_checkpointing());
  EXPECT_EQ(plan->zero_stage(), 0);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"),
              HasSubstr("because without it even per-device batch 1 needs 11.3 MiB; the script recomputes them "
                        "(FITRUN_ACTIVATION_CHECKPOINTING=1)"));

  spec.mutable_ddp()->set_zero_stage(1);
  plan = PlanJob(spec, model, Devices(2, 10 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->zero_stage(), 1);
  const fitrun::v1::JobSpec unsharded_spec = [&] {
    fitrun::v1::JobSpec s = spec;
    s.mutable_ddp()->clear_zero_stage();
    return s;
  }();
  absl::StatusOr<fitrun::v1::Plan> unsharded = PlanJob(unsharded_spec, model, Devices(2, 10 * kMiB));
  ASSERT_TRUE(unsharded.ok()) << unsharded.status();
  EXPECT_EQ(plan->predicted().total_bytes(), unsharded->predicted().total_bytes());
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"),
              HasSubstr("zero_stage: 1, optimizer states sharded over the 2 ranks, because spec.ddp.zero_stage is 1; "
                        "the script shards them (FITRUN_ZERO_STAGE=1)"));
}

}  // namespace
}  // namespace fitrun::server
