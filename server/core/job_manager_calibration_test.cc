// The job manager with a memory calibrator: jobs are planned with the probe's measured line, the
// probe runs outside the manager's lock, and a job whose model is not measured yet waits queued.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "server/core/fakes.h"
#include "server/core/job_manager.h"
#include "server/core/job_manager_testing.h"
#include "server/core/job_spec.h"
#include "server/core/memory_calibration.h"
#include "server/core/test_specs.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

fitrun::v1::JobSpec MlpSpec() {
  fitrun::v1::JobSpec spec = MlpTestSpec(1024, 1, 2);
  spec.set_name("calibrated");
  spec.mutable_optimizer()->set_lr(0.05);
  spec.set_max_steps(10);
  return spec;
}

ProbeResult MlpProbe() { return MlpProbeResult(/*small_batch=*/4, /*large_batch=*/16); }

class JobManagerCalibrationTest : public ::testing::Test {
 protected:
  // Two 16 MiB devices: the analytic estimate (40 MiB of fixed overheads) fits nothing on them.
  JobManagerCalibrationTest() : devices_(2, 16LL << 20), probe_(MlpProbe()) {}

  void SetUp() override {
    const auto state_dir = std::filesystem::path(::testing::TempDir()) /
                           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(state_dir);
    calibrator_ = *MemoryCalibrator::Create({}, &probe_);
    JobManager::Options options;
    options.state_dir = state_dir.string();
    options.worker_binary = "/bin/fitrun-worker";
    options.worker_channel_address = "127.0.0.1:1";
    options.pick_master_port = [] { return 29500; };
    options.memory_calibrator = calibrator_.get();
    manager_ = *JobManager::Create(options, &store_, &devices_, &launcher_, &metrics_);
  }
  void TearDown() override { manager_.reset(); }

  fitrun::v1::Job WaitForState(const std::string& id, fitrun::v1::JobState state) {
    return server::WaitForState(*manager_, id, state);
  }

  FakeJobStore store_;
  FakeDeviceInventory devices_;
  FakeWorkerLauncher launcher_;
  RecordingMetrics metrics_;
  FakeMemoryProbe probe_;
  std::unique_ptr<MemoryCalibrator> calibrator_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerCalibrationTest, SubmitProbesOnceAndThePlanUsesTheMeasuredLine) {
  absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(MlpSpec());
  ASSERT_TRUE(job.ok()) << job.status();  // the analytic estimate alone would refuse it
  ASSERT_TRUE(launcher_.WaitForLaunches(2, absl::Seconds(5)));
  const fitrun::v1::Plan plan = manager_->Get(job->id())->plan();
  // 0.9 * 16 MiB / 1.03 = 14.66 MB less the measured 12.32 MB fixed: 450 samples of 5192 B;
  // each rank takes 512 per step, so 256 with 2 accumulation passes.
  EXPECT_EQ(plan.device_ids_size(), 2);
  EXPECT_EQ(plan.per_device_batch(), 256);
  EXPECT_EQ(plan.grad_accum_steps(), 2);
  EXPECT_EQ(plan.predicted().total_bytes() - plan.predicted().safety_margin_bytes(), 12322992 + 5192 * 256);
  ASSERT_TRUE(manager_->Submit(MlpSpec()).ok());
  EXPECT_EQ(probe_.calls(), 1);
}

TEST_F(JobManagerCalibrationTest, DryRunProbesAndExplainsTheSource) {
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> plan = manager_->DryRunPlan(MlpSpec());
  ASSERT_TRUE(plan.ok()) << plan.status();
  bool explained = false;
  for (const std::string& r : plan->second.reasons()) explained |= absl::StrContains(r, "memory estimate: calibrated");
  EXPECT_TRUE(explained);
  EXPECT_EQ(probe_.calls(), 1);
}

TEST_F(JobManagerCalibrationTest, AJobWithoutAMeasurementWaitsQueuedWhileTheProbeRuns) {
  // A job stored by an earlier coordinator whose cache is gone: the first Submit measures it, then
  // the cache is dropped by using a new calibrator for a second manager over the same store.
  ASSERT_TRUE(manager_->Submit(MlpSpec()).ok());
  ASSERT_TRUE(launcher_.WaitForLaunches(2, absl::Seconds(5)));
  manager_.reset();

  FakeDeviceInventory devices(2, 16LL << 20);
  FakeWorkerLauncher launcher;  // the old ranks are gone: the job restarts
  FakeMemoryProbe probe(MlpProbe());
  probe.Hold();
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  JobManager::Options options;
  options.state_dir = (std::filesystem::path(::testing::TempDir()) / "restarted").string();
  options.worker_binary = "/bin/fitrun-worker";
  options.worker_channel_address = "127.0.0.1:1";
  options.pick_master_port = [] { return 29500; };
  options.memory_calibrator = calibrator.get();
  auto manager = *JobManager::Create(options, &store_, &devices, &launcher, &metrics_);

  // The probe is held: nothing launches, and the job's events say why.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (probe.calls() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(probe.calls(), 1);
  EXPECT_FALSE(launcher.WaitForLaunches(1, absl::Milliseconds(300)));
  const std::string id = manager->List({}).front().id();
  bool measuring = false;
  const absl::StatusOr<std::vector<fitrun::v1::JobEvent>> events = manager->ReadEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok()) << events.status();
  for (const fitrun::v1::JobEvent& e : *events) {
    measuring |= e.has_log() && absl::StrContains(e.log().text(), "measuring memory");
  }
  EXPECT_TRUE(measuring);

  probe.Release();
  EXPECT_TRUE(launcher.WaitForLaunches(2, absl::Seconds(5)));
  EXPECT_EQ(probe.calls(), 1);
  manager.reset();
}

}  // namespace
}  // namespace fitrun::server
