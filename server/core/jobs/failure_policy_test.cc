#include "server/core/jobs/failure_policy.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace fitrun::server {
namespace {

fitrun::v1::Job JobWithLimits(int max_oom_retries, int max_restarts) {
  fitrun::v1::Job job;
  job.mutable_spec()->mutable_fault_tolerance()->set_max_oom_retries(max_oom_retries);
  job.mutable_spec()->mutable_fault_tolerance()->set_max_restarts(max_restarts);
  return job;
}

void OomAt(fitrun::v1::Job& job, int64_t batch) { job.add_oom_history()->set_per_device_batch(batch); }

TEST(FailurePolicyTest, AnOutOfMemoryIsReplannedUntilItsRetriesAreSpent) {
  fitrun::v1::Job job = JobWithLimits(2, 3);
  OomAt(job, 64);
  FailureDecision first = DecideAfterFailure(job, FailureKind::kOutOfMemory, {});
  EXPECT_TRUE(first.retry);
  EXPECT_TRUE(absl::StrContains(first.decision, "re-plan 1 of 2")) << first.decision;
  OomAt(job, 32);
  EXPECT_TRUE(DecideAfterFailure(job, FailureKind::kOutOfMemory, {}).retry);
  OomAt(job, 16);
  FailureDecision spent = DecideAfterFailure(job, FailureKind::kOutOfMemory, {});
  EXPECT_FALSE(spent.retry);
  EXPECT_TRUE(absl::StrContains(spent.decision, "giving up after 2 re-plan(s)")) << spent.decision;
  EXPECT_EQ(job.oom_replans(), 2);
  EXPECT_EQ(job.restarts(), 0) << "re-plans and restarts have limits of their own";
}

TEST(FailurePolicyTest, AFixedBatchOrBatchOneOutOfMemoryEndsTheJobSayingWhy) {
  fitrun::v1::Job fixed = JobWithLimits(3, 3);
  fixed.mutable_spec()->mutable_resources()->set_per_device_batch(8);
  OomAt(fixed, 8);
  FailureDecision decision = DecideAfterFailure(fixed, FailureKind::kOutOfMemory, {});
  EXPECT_FALSE(decision.retry);
  EXPECT_TRUE(absl::StrContains(decision.decision, "spec.resources.per_device_batch fixes the batch at 8"));

  fitrun::v1::Job at_one = JobWithLimits(3, 3);
  OomAt(at_one, 1);
  decision = DecideAfterFailure(at_one, FailureKind::kOutOfMemory, {});
  EXPECT_FALSE(decision.retry);
  EXPECT_TRUE(absl::StrContains(decision.decision, "even a per-device batch of 1 does not fit"));
  // Unless measuring the workload may still find a plan the estimate ruled out.
  FailureFacts measuring;
  measuring.measuring_may_find_a_plan = [] { return true; };
  EXPECT_TRUE(DecideAfterFailure(at_one, FailureKind::kOutOfMemory, measuring).retry);
}

TEST(FailurePolicyTest, AHostMemoryOutOfMemoryOnAGpuFailsNamingTheLimit) {
  fitrun::v1::Job job = JobWithLimits(3, 3);
  OomAt(job, 64);
  FailureFacts facts;
  facts.runs_on_gpus = true;
  facts.raise_host_memory_advice = "raise spec.resources.host_memory (each rank may use 8.00 GiB now, the default)";
  FailureDecision on_gpu = DecideAfterFailure(job, FailureKind::kHostOutOfMemory, facts);
  EXPECT_FALSE(on_gpu.retry);
  EXPECT_TRUE(absl::StrContains(on_gpu.decision, "does not shrink with its per-device batch; raise")) << on_gpu.decision;
  facts.runs_on_gpus = false;
  FailureDecision on_cpu = DecideAfterFailure(job, FailureKind::kHostOutOfMemory, facts);
  EXPECT_TRUE(on_cpu.retry);
  EXPECT_TRUE(absl::StrContains(on_cpu.decision, "should it recur, raise")) << on_cpu.decision;
}

TEST(FailurePolicyTest, CrashesAndHangsRestartUntilMaxRestartsAndABadConfigNever) {
  fitrun::v1::Job job = JobWithLimits(3, 1);
  FailureDecision crash = DecideAfterFailure(job, FailureKind::kCrash, {});
  EXPECT_TRUE(crash.retry);
  EXPECT_TRUE(absl::StrContains(crash.decision, "restart 1 of 1")) << crash.decision;
  FailureDecision hang = DecideAfterFailure(job, FailureKind::kHang, {});
  EXPECT_FALSE(hang.retry);
  EXPECT_TRUE(absl::StrContains(hang.decision, "giving up after 1 restart(s)")) << hang.decision;
  fitrun::v1::Job fresh = JobWithLimits(3, 3);
  EXPECT_FALSE(DecideAfterFailure(fresh, FailureKind::kBadConfig, {}).retry);
  EXPECT_EQ(fresh.restarts(), 0);
  EXPECT_STREQ(FailureKindLabel(FailureKind::kHostOutOfMemory), "host_out_of_memory");
}

}  // namespace
}  // namespace fitrun::server
