// A script attempt's first steps: measured once every rank reported enough steps with a peak (the
// highest rank's), never for an attempt that ran out of memory; a re-plan is worth a restart only
// for a larger batch on the same devices and strategy.
#include "server/core/jobs/first_steps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

fitrun::v1::Plan PlanOf(int64_t batch, int32_t passes, int64_t total_steps = 100) {
  fitrun::v1::Plan plan;
  plan.add_device_ids("cpu:0");
  plan.add_device_ids("cpu:1");
  plan.set_per_device_batch(batch);
  plan.set_grad_accum_steps(passes);
  plan.set_total_steps(total_steps);
  return plan;
}

ActiveAttempt AttemptWith(std::vector<std::pair<int64_t, int64_t>> step_and_peak) {
  ActiveAttempt attempt;
  attempt.attempt = 1;
  for (const auto& [step, peak] : step_and_peak) {
    RankState rank;
    rank.last_step = step;
    rank.peak_bytes = peak;
    attempt.ranks.push_back(rank);
  }
  return attempt;
}

TEST(FirstStepsTest, MeasuredOnceEveryRankReportedItsFirstStepsWithAPeak) {
  const fitrun::v1::Plan plan = PlanOf(8, 2);
  EXPECT_FALSE(MeasuredInFirstSteps(AttemptWith({{2, 500}, {1, 600}}), plan).has_value()) << "rank 1 at step 1";
  EXPECT_FALSE(MeasuredInFirstSteps(AttemptWith({{2, 500}, {2, 0}}), plan).has_value()) << "no peak from rank 1";
  const std::optional<FirstStepsPeak> measured = MeasuredInFirstSteps(AttemptWith({{2, 500}, {3, 600}}), plan);
  ASSERT_TRUE(measured.has_value());
  EXPECT_EQ(measured->per_device_batch, 8);
  EXPECT_EQ(measured->peak_bytes, 600);
  EXPECT_TRUE(MeasuredInFirstSteps(AttemptWith({{1, 500}, {1, 600}}), PlanOf(8, 2, /*total_steps=*/1)).has_value())
      << "a one-step job's first step is all it takes";
  ActiveAttempt finished = AttemptWith({{2, 500}, {0, 600}});
  finished.ranks[1].finished.emplace();
  EXPECT_TRUE(MeasuredInFirstSteps(finished, plan).has_value()) << "a finished rank has allocated everything";
  ActiveAttempt ran_out = AttemptWith({{2, 500}, {2, 600}});
  ran_out.out_of_memory = true;
  EXPECT_FALSE(MeasuredInFirstSteps(ran_out, plan).has_value());
}

TEST(FirstStepsTest, OnlyALargerBatchOnTheSameDevicesAndStrategyIsWorthARestart) {
  const fitrun::v1::Plan running = PlanOf(4, 4);
  EXPECT_TRUE(WorthMovingTo(running, PlanOf(8, 2)));
  EXPECT_FALSE(WorthMovingTo(running, PlanOf(4, 4))) << "the same plan";
  EXPECT_FALSE(WorthMovingTo(running, PlanOf(2, 8))) << "a batch that ran is not made smaller";
  fitrun::v1::Plan elsewhere = PlanOf(8, 2);
  elsewhere.set_device_ids(1, "cpu:2");
  EXPECT_FALSE(WorthMovingTo(running, elsewhere));
  fitrun::v1::Plan recomputing = PlanOf(8, 2);
  recomputing.set_activation_checkpointing(true);
  EXPECT_FALSE(WorthMovingTo(running, recomputing));
}

TEST(FirstStepsTest, TheLineSaysWhatWasMeasuredAndWhereTheJobMoves) {
  const FirstStepsPeak measured{4, 300LL << 20};
  fitrun::v1::Plan to = PlanOf(8, 2);
  to.mutable_predicted()->set_total_bytes(450LL << 20);
  EXPECT_THAT(DescribeFirstSteps(2, measured, PlanOf(4, 4), nullptr),
              HasSubstr("attempt 2's first steps peaked at 300.0 MiB at per-device batch 4; recorded for the plans "
                        "after it; the plan keeps its batch"));
  EXPECT_THAT(DescribeFirstSteps(2, measured, PlanOf(4, 4), &to),
              HasSubstr("the plan takes per-device batch 8 x 2 accumulation (predicted peak 450.0 MiB) instead of 4 x 4: "
                        "moving there at the next checkpoint"));
}

}  // namespace
}  // namespace fitrun::server
