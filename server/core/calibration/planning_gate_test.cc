// The planning gate on its own, with the real calibrator over a fake probe: without a calibrator
// nothing waits; an unmeasured workload with a tight plan waits for its sweep (started once, its end
// asks for a pass); a roomy plan whose analytic estimate is an upper bound launches without a probe
// and says why; one job per workload is shown in PLANNING; a pass asks each shape once; a plan beyond
// the measured batches has its batch measured before launch.
#include "server/core/calibration/planning_gate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "server/core/specs/test_specs.h"
#include "server/core/specs/workloads.h"
#include "server/core/testing/fake_memory_probe.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

std::vector<DeviceCapacity> Devices(int count, int64_t bytes) {
  std::vector<DeviceCapacity> devices;
  for (int i = 0; i < count; ++i) devices.push_back({absl::StrCat("cpu:", i), bytes, ""});
  return devices;
}

fitrun::v1::Job JobOf(const fitrun::v1::JobSpec& spec) {
  fitrun::v1::Job job;
  *job.mutable_spec() = spec;
  return job;
}

// A user's own training script, global batch 32 on two ranks.
fitrun::v1::JobSpec ScriptSpec(bool applies_strategy = false) {
  fitrun::v1::JobSpec spec;
  spec.set_name("script");
  spec.mutable_script()->add_command("/usr/bin/python3");
  spec.mutable_script()->add_command("train.py");
  spec.mutable_script()->set_working_dir("/tmp");
  spec.mutable_script()->set_applies_strategy(applies_strategy);
  spec.set_global_batch_size(32);
  spec.mutable_resources()->set_min_devices(2);
  spec.mutable_resources()->set_max_devices(2);
  return spec;
}

fitrun::v1::Job WithOutOfMemoryAt(fitrun::v1::Job job, int64_t batch) {
  fitrun::v1::OutOfMemory* oom = job.add_oom_history();
  oom->set_per_device_batch(batch);
  oom->set_live_bytes(900LL << 20);
  oom->set_requested_bytes(200LL << 20);
  return job;
}

class PlanningGateTest : public ::testing::Test {
 protected:
  PlanningGateTest() : probe_(MlpPeakBytes), calibrator_(*MemoryCalibrator::Create({}, &probe_)) {}

  PlanningGate::Planner planner_ = [this](const fitrun::v1::Job& job, const std::vector<DeviceCapacity>& devices) {
    ++plans_;
    return PlanJob(job.spec(), *calibrator_->ProfileFor(job.spec(), job.run_as()), devices);
  };
  std::atomic<int> plans_{0};
  FakeMemoryProbe probe_;
  std::unique_ptr<MemoryCalibrator> calibrator_;
};

TEST_F(PlanningGateTest, WithoutACalibratorNothingWaits) {
  PlanningGate gate(nullptr, [] {});
  EXPECT_FALSE(gate.measures());
  EXPECT_TRUE(gate.Settled(MlpTestSpec(), ""));
  EXPECT_EQ(gate.AwaitCalibration(MlpTestSpec(), 1LL << 30, ""), "");
  PlanningGate::Pass pass(&gate, Devices(2, 1LL << 20), 1LL << 20, planner_);
  const PlanningGate::BeforePlanning before = pass.Check(JobOf(MlpTestSpec()), "key", false);
  EXPECT_TRUE(before.waiting_for.empty());
  EXPECT_TRUE(before.without_probe.empty());
}

TEST_F(PlanningGateTest, AnUnmeasuredWorkloadWithATightPlanWaitsForItsSweepWhichAsksForAPassWhenDone) {
  absl::Notification measured;
  PlanningGate gate(calibrator_.get(), [&] { measured.Notify(); });
  const fitrun::v1::JobSpec spec = MlpTestSpec(1024, 1, 2);
  EXPECT_FALSE(gate.Settled(spec, ""));
  // 16 MiB: the analytic estimate's fixed overheads alone fill it, so the plan is not roomy.
  EXPECT_EQ(gate.LaunchesWithoutProbe(JobOf(spec), Devices(2, 16LL << 20), planner_), "");
  const std::string waiting = gate.AwaitCalibration(spec, 16LL << 20, "");
  EXPECT_THAT(waiting, HasSubstr("measuring memory: fitrun-worker --probe runs the workload at growing "
                                 "micro-batches, up to 1024 or 16.0 MiB"));
  ASSERT_TRUE(measured.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(gate.Settled(spec, ""));
  EXPECT_EQ(gate.AwaitCalibration(spec, 16LL << 20, ""), "") << "measured: nothing left to wait for";
  EXPECT_EQ(probe_.calls(), 1);
}

TEST_F(PlanningGateTest, ARoomyPlanOnAnUpperBoundLaunchesWithoutAProbeAndSaysWhy) {
  PlanningGate gate(calibrator_.get(), [] {});
  const fitrun::v1::JobSpec spec = MlpTestSpec(256, 1, 2);
  ASSERT_TRUE(AnalyticEstimateIsUpperBound(spec));
  const std::string why = gate.LaunchesWithoutProbe(JobOf(spec), Devices(2, 4LL << 30), planner_);
  EXPECT_THAT(why, HasSubstr("no memory probe: the analytic estimate, an upper bound, predicts"));
  EXPECT_THAT(why, HasSubstr("under half"));
  PlanningGate::Pass pass(&gate, Devices(2, 4LL << 30), 4LL << 30, planner_);
  EXPECT_EQ(pass.Check(JobOf(spec), CalibrationKey(spec, ""), false).without_probe, why);
  EXPECT_EQ(probe_.calls(), 0);
}

TEST_F(PlanningGateTest, OneJobPerWorkloadIsShownInPlanningAndEachShapeIsPlannedOnce) {
  probe_.Hold();
  PlanningGate gate(calibrator_.get(), [] {});
  const fitrun::v1::JobSpec spec = MlpTestSpec(1024, 1, 2);
  const std::string key = CalibrationKey(spec, "");
  PlanningGate::Pass pass(&gate, Devices(2, 16LL << 20), 16LL << 20, planner_);
  const PlanningGate::BeforePlanning first = pass.Check(JobOf(spec), key, false);
  EXPECT_FALSE(first.waiting_for.empty());
  EXPECT_TRUE(first.wait_in_planning);
  for (int i = 0; i < 100; ++i) {
    const PlanningGate::BeforePlanning other = pass.Check(JobOf(spec), key, false);
    EXPECT_EQ(other.waiting_for, first.waiting_for);
    EXPECT_FALSE(other.wait_in_planning);
  }
  EXPECT_TRUE(pass.Check(JobOf(spec), key, /*in_planning=*/true).wait_in_planning)
      << "a job already in PLANNING stays there";
  EXPECT_EQ(plans_, 1) << "a queue of one shape is planned once per pass";
  probe_.Release();
}

TEST_F(PlanningGateTest, APlanBeyondTheMeasuredBatchesIsMeasuredBeforeLaunch) {
  const fitrun::v1::JobSpec spec = MlpTestSpec(4096, 1, 1);
  SweepLimits limits;
  limits.max_batch = 256;
  limits.max_bytes = 1LL << 30;
  ASSERT_TRUE(calibrator_->CalibrateNow(spec, limits).ok());
  absl::Notification measured;
  PlanningGate gate(calibrator_.get(), [&] { measured.Notify(); });
  absl::StatusOr<fitrun::v1::Plan> plan = planner_(JobOf(spec), Devices(1, 1LL << 30));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->per_device_batch(), 256);
  const std::string waiting = gate.AwaitPlanMeasurement(spec, *plan, "");
  EXPECT_THAT(waiting, HasSubstr(absl::StrCat("measuring the peak at per-device batch ", plan->per_device_batch(),
                                              " before launch")));
  ASSERT_TRUE(measured.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(gate.AwaitPlanMeasurement(spec, *plan, ""), "") << "measured now: it launches";

  fitrun::v1::JobSpec fixed = spec;
  fixed.mutable_resources()->set_per_device_batch(4096);
  EXPECT_EQ(gate.AwaitPlanMeasurement(fixed, *plan, ""), "") << "a fixed batch is the user's call";
}

// A script nothing has measured: only running it can, so its first run is its measurement. It is
// not probed first, its plan takes the largest batch and predicts nothing, and its runs' peaks are
// its calibration for the next plan.
TEST_F(PlanningGateTest, AFirstSeenScriptLaunchesAtOnceAndItsRunsAreItsCalibration) {
  PlanningGate gate(calibrator_.get(), [] {});
  const fitrun::v1::JobSpec spec = ScriptSpec();
  PlanningGate::Pass pass(&gate, Devices(2, 1LL << 30), 1LL << 30, planner_);
  const PlanningGate::BeforePlanning before = pass.Check(JobOf(spec), CalibrationKey(spec, ""), false);
  EXPECT_THAT(before.without_probe, HasSubstr("its first run is its measurement"));
  EXPECT_TRUE(before.waiting_for.empty());
  absl::StatusOr<fitrun::v1::Plan> plan = planner_(JobOf(spec), Devices(2, 1LL << 30));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 16) << "the largest the spec allows";
  EXPECT_EQ(plan->predicted().total_bytes(), 0) << "nothing to predict it from";
  EXPECT_EQ(gate.AwaitPlanMeasurement(spec, *plan, ""), "") << "its run measures its batch";

  // The run peaked at 600 MiB at batch 16: the next plan stands on that, with no probe.
  calibrator_->RecordRun(spec, "", 16, 600LL << 20);
  plan = planner_(JobOf(spec), Devices(2, 1LL << 30));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 16);
  EXPECT_GE(plan->predicted().total_bytes(), 600LL << 20);
  EXPECT_LE(plan->predicted().total_bytes(), 620LL << 20) << "the run's peak and the calibrated margin";
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("measured by its runs"));
  EXPECT_EQ(probe_.calls(), 0);
  EXPECT_FALSE(gate.Settled(spec, "")) << "what runs bound is not the last word";

  // On smaller devices its run bounds every batch below 16 by 600 MiB, so nothing fits on what runs
  // measured: the probe measures the smaller batches rather than the job failing.
  EXPECT_FALSE(planner_(JobOf(spec), Devices(2, 500LL << 20)).ok());
  PlanningGate::Pass small(&gate, Devices(2, 500LL << 20), 500LL << 20, planner_);
  const PlanningGate::BeforePlanning swept = small.Check(JobOf(spec), CalibrationKey(spec, ""), false);
  EXPECT_THAT(swept.waiting_for, HasSubstr("measuring memory"));
  EXPECT_THAT(swept.waiting_for, HasSubstr("its runs ran at batches too large for these devices"));
}

// Its first out-of-memory error re-plans from what it needed, without a probe; a second one, or one
// where the plan could still recompute activations, has the probe measure it below the failed batch.
TEST_F(PlanningGateTest, AScriptIsProbedOnlyAfterItsRunsRanOutOfMemory) {
  absl::Notification measured;
  PlanningGate gate(calibrator_.get(), [&] { measured.Notify(); });
  const fitrun::v1::Job once = WithOutOfMemoryAt(JobOf(ScriptSpec()), 16);
  EXPECT_THAT(gate.LaunchesFromTheRun(once), HasSubstr("re-planned from the out-of-memory error"));
  const fitrun::v1::Job open_strategy = WithOutOfMemoryAt(JobOf(ScriptSpec(/*applies_strategy=*/true)), 16);
  EXPECT_TRUE(gate.MeasuringMayFindAPlan(open_strategy.spec(), ""));
  EXPECT_EQ(gate.LaunchesFromTheRun(open_strategy), "") << "recomputing may fit where keeping did not";
  const fitrun::v1::Job twice = WithOutOfMemoryAt(once, 8);
  EXPECT_EQ(gate.LaunchesFromTheRun(twice), "");

  PlanningGate::Pass pass(&gate, Devices(2, 1LL << 30), 1LL << 30, planner_);
  const PlanningGate::BeforePlanning before = pass.Check(twice, CalibrationKey(twice.spec(), ""), false);
  EXPECT_TRUE(before.without_probe.empty());
  EXPECT_THAT(before.waiting_for, HasSubstr("up to 7 or")) << "below the smallest batch that ran out";
  ASSERT_TRUE(measured.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(probe_.calls(), 1);
}

}  // namespace
}  // namespace fitrun::server
