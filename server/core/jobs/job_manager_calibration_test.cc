// The job manager with a memory calibrator: Submit never waits for a probe, a job whose workload is
// not measured yet waits in PLANNING while the sweep runs on the calibrator's thread, a plan whose
// batch is tight or beyond what was measured is measured before launch (and steps down when it does
// not fit), and every finished attempt's measured peak corrects the next plan.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"
#include "server/core/specs/job_specs.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/core/specs/test_specs.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_memory_probe.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

fitrun::v1::JobSpec MlpSpec(int64_t global_batch = 1024) {
  fitrun::v1::JobSpec spec = MlpTestSpec(global_batch, 1, 2);
  spec.set_name("calibrated");
  spec.mutable_optimizer()->set_lr(0.05);
  spec.set_max_steps(10);
  return spec;
}

class JobManagerCalibrationTest : public ::testing::Test {
 protected:
  void TearDown() override {
    jobs_.Stop();
    calibrator_.reset();
  }

  // Two devices of `bytes` each; the probe plays `peak`.
  void Start(int64_t bytes, FakeMemoryProbe::PeakFunction peak = MlpPeakBytes) {
    jobs_.set_devices(FakeDeviceInventory(2, bytes));
    probe_ = std::make_unique<FakeMemoryProbe>(std::move(peak));
    calibrator_ = *MemoryCalibrator::Create({.cache_path = (jobs_.state_dir() / "memory_calibration.tsv").string()},
                                            probe_.get());
    jobs_.options().final_report_wait = absl::Milliseconds(100);
    jobs_.options().memory_calibrator = calibrator_.get();
    ASSERT_EQ(jobs_.Start(), absl::OkStatus());
  }

  fitrun::v1::Job WaitForState(const std::string& id, fitrun::v1::JobState state) {
    return server::WaitForState(jobs_.manager(), id, state);
  }

  // Every log line and state-change reason the job's watchers saw.
  std::string Events(const std::string& id) {
    std::string text;
    const absl::StatusOr<std::vector<fitrun::v1::JobEvent>> events = jobs_.manager().ReadEvents(id, 0, 10000);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return text;
    for (const fitrun::v1::JobEvent& e : *events) {
      if (e.has_log()) absl::StrAppend(&text, e.log().text(), "\n");
      if (e.has_state_changed()) absl::StrAppend(&text, e.state_changed().reason(), "\n");
    }
    return text;
  }

  // Plays the job's two ranks of attempt 1: progress at `step` with `peak` bytes, then finished and exited.
  void RunRanksToTheEnd(const std::string& id, int64_t peak) {
    for (int rank = 0; rank < 2; ++rank) {
      fitrun::v1::WorkerReport progress;
      progress.mutable_progress()->set_step(10);
      progress.mutable_progress()->set_total_steps(10);
      progress.mutable_progress()->set_peak_bytes(peak - rank);  // rank 0 peaks highest
      jobs_.manager().OnWorkerReport(WorkerKey{id, 1, rank}, progress);
      fitrun::v1::WorkerReport finished;
      finished.mutable_finished()->set_steps(10);
      jobs_.manager().OnWorkerReport(WorkerKey{id, 1, rank}, finished);
    }
    jobs_.launcher().Exit(0, 0);
    jobs_.launcher().Exit(1, 0);
  }

  std::unique_ptr<FakeMemoryProbe> probe_;
  std::unique_ptr<MemoryCalibrator> calibrator_;
  TestJobManager jobs_;  // after the calibrator its options point to
};

// A user's training script (a file in the test's directory), global batch 16 on both devices.
fitrun::v1::JobSpec ScriptSpec() {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "script";
  std::filesystem::create_directories(dir);
  if (!std::filesystem::exists(dir / "train.py")) std::ofstream(dir / "train.py") << "print('training')\n";
  fitrun::v1::JobSpec spec;
  spec.set_name("script");
  spec.mutable_script()->add_command("/usr/bin/python3");
  spec.mutable_script()->add_command("train.py");
  spec.mutable_script()->set_working_dir(dir.string());
  spec.set_global_batch_size(16);
  spec.mutable_resources()->set_min_devices(2);
  spec.mutable_resources()->set_max_devices(2);
  spec.set_max_steps(100);
  return spec;
}

// Rank `rank` of the attempt reports optimizer step `step` with `peak` bytes.
void ReportStep(JobManager& manager, const std::string& id, int attempt, int rank, int64_t step, int64_t peak) {
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(step);
  progress.mutable_progress()->set_peak_bytes(peak);
  manager.OnWorkerReport(WorkerKey{id, attempt, rank}, progress);
}

// A script nothing has measured starts at once, with no probe and no predicted peak; once both ranks
// have reported their first steps the peak they reached is recorded, so a second submit, while the
// first still runs, is planned on it.
TEST_F(JobManagerCalibrationTest, AFirstSeenScriptStartsAtOnceAndItsFirstStepsPlanTheNextOne) {
  Start(1LL << 30);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(ScriptSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(10)));
  fitrun::v1::Job running = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(probe_->calls(), 0) << "no probe before the first run";
  EXPECT_EQ(running.plan().per_device_batch(), 8);
  EXPECT_EQ(running.plan().predicted().total_bytes(), 0);
  EXPECT_THAT(absl::StrJoin(running.plan().reasons(), "\n"), HasSubstr("its first run is its measurement"));

  ReportStep(jobs_.manager(), job->id(), 1, 0, 2, 300LL << 20);
  EXPECT_THAT(Events(job->id()), ::testing::Not(HasSubstr("first steps peaked"))) << "rank 1 has not reported";
  ReportStep(jobs_.manager(), job->id(), 1, 1, 2, 310LL << 20);
  EXPECT_THAT(Events(job->id()), HasSubstr("memory: attempt 1's first steps peaked at 310.0 MiB at per-device "
                                           "batch 8"));
  EXPECT_THAT(Events(job->id()), HasSubstr("the plan keeps its batch"));

  fitrun::v1::JobSpec second = ScriptSpec();
  second.mutable_resources()->set_min_devices(1);
  second.mutable_resources()->set_max_devices(1);
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> planned = jobs_.manager().DryRunPlan(second);
  ASSERT_TRUE(planned.ok()) << planned.status();
  // One device: 16 samples a step. The run's 310 MiB at 8 bounds 16 at 620 MiB (all of it per sample).
  EXPECT_EQ(planned->second.per_device_batch(), 16);
  EXPECT_NEAR(planned->second.predicted().total_bytes(), 620.0 * 1.03 * (1 << 20), 2.0 * (1 << 20));
  EXPECT_THAT(absl::StrJoin(planned->second.reasons(), "\n"), HasSubstr("measured by its runs"));
  EXPECT_EQ(probe_->calls(), 0);
}

// Where its first steps show the plan a larger batch fits on the devices it holds, the attempt
// moves there at its next checkpoint: one restart, resuming from it, once per job.
TEST_F(JobManagerCalibrationTest, AScriptMovesToTheLargerBatchItsFirstStepsAllowAtItsNextCheckpoint) {
  Start(72LL << 20);
  // Earlier runs: 30 MiB at batch 1, 36 MiB at 2 (6 MiB a sample, extrapolated): batch 8 looks like
  // 72 MiB, over the 64.8 MiB usable, so the plan starts at 4 x 2.
  const fitrun::v1::JobSpec normalized = jobs_.manager().DryRunPlan(ScriptSpec())->first;  // as submitted: read files
  calibrator_->RecordRun(normalized, "", 1, 30LL << 20);
  calibrator_->RecordRun(normalized, "", 2, 36LL << 20);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(ScriptSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(10)));
  const fitrun::v1::Job first = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(first.plan().per_device_batch(), 4);
  ASSERT_EQ(first.plan().grad_accum_steps(), 2);
  // At 4 it peaks at 38 MiB: the slope flattens, and batch 8 fits.
  ReportStep(jobs_.manager(), job->id(), 1, 0, 2, 38LL << 20);
  ReportStep(jobs_.manager(), job->id(), 1, 1, 2, 38LL << 20);
  EXPECT_THAT(Events(job->id()), HasSubstr("the plan takes per-device batch 8 x 1 accumulation"));
  EXPECT_THAT(Events(job->id()), HasSubstr("moving there at the next checkpoint"));
  EXPECT_EQ(jobs_.manager().Get(job->id())->state(), fitrun::v1::JOB_STATE_RUNNING) << "not before a checkpoint";
  fitrun::v1::WorkerReport checkpoint;
  checkpoint.mutable_checkpoint_saved()->set_step(5);
  jobs_.manager().OnWorkerReport(WorkerKey{job->id(), 1, 0}, checkpoint);
  WaitForState(job->id(), fitrun::v1::JOB_STATE_RESTARTING);
  jobs_.launcher().Exit(0, 143);
  jobs_.launcher().Exit(1, 143);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(4, absl::Seconds(10)));
  const fitrun::v1::Job moved = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(moved.plan().per_device_batch(), 8);
  EXPECT_EQ(moved.plan().grad_accum_steps(), 1);
  EXPECT_EQ(moved.measured_moves(), 1);
  EXPECT_THAT(moved.attempt_history(0).outcome(), HasSubstr("from the checkpoint of step 5"));
  // Its first steps again: measured and kept, whatever they show (one move per job).
  ReportStep(jobs_.manager(), job->id(), 2, 0, 2, 44LL << 20);
  ReportStep(jobs_.manager(), job->id(), 2, 1, 2, 44LL << 20);
  EXPECT_THAT(Events(job->id()), HasSubstr("attempt 2's first steps peaked at 44.0 MiB"));
}

TEST_F(JobManagerCalibrationTest, SubmitAnswersAtOnceAndTheJobWaitsInPlanningForTheProbe) {
  // 16 MiB devices: the analytic estimate (40 MiB of fixed overheads) fits nothing on them, so only
  // the measurement can tell that the job fits.
  Start(16LL << 20);
  probe_->Hold();
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), fitrun::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(jobs_.store().job_count(), 1u);
  WaitForState(job->id(), fitrun::v1::JOB_STATE_PLANNING);
  EXPECT_THAT(Events(job->id()), HasSubstr("measuring memory: fitrun-worker --probe"));
  // A scheduling pass while the probe is held: the job stays in PLANNING, nothing is launched.
  jobs_.manager().RunSchedulingPass();
  EXPECT_TRUE(jobs_.launcher().launches().empty());
  EXPECT_EQ(jobs_.manager().Get(job->id())->state(), fitrun::v1::JOB_STATE_PLANNING);

  probe_->Release();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  const fitrun::v1::Job running = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  // 0.9 * 16 MiB / 1.03 = 14.66 MB of measured peak: 512 samples (13.84 MB) fit, and each rank takes
  // 512 per step. The sweep measured up to 512, the most a rank of this job can take.
  EXPECT_EQ(running.plan().per_device_batch(), 512);
  EXPECT_EQ(running.plan().grad_accum_steps(), 1);
  EXPECT_EQ(running.plan().predicted().total_bytes() - running.plan().predicted().safety_margin_bytes(),
            MlpPeakBytes(512));
  EXPECT_EQ(probe_->calls(), 1);

  // The next job of the workload is planned at once, without a probe.
  ASSERT_TRUE(jobs_.manager().Submit(MlpSpec()).ok());
  EXPECT_EQ(probe_->calls(), 1);
}

TEST_F(JobManagerCalibrationTest, OneJobWaitsInPlanningPerWorkloadTheOthersStayQueued) {
  Start(16LL << 20);
  probe_->Hold();
  const std::string first = jobs_.manager().Submit(MlpSpec())->id();
  WaitForState(first, fitrun::v1::JOB_STATE_PLANNING);
  // Submitted while the probe runs: accepted on the analytic estimate's upper bound, which fits
  // nothing here, because its workload is not measured yet.
  const std::string second = jobs_.manager().Submit(MlpSpec())->id();
  EXPECT_EQ(jobs_.manager().Get(second)->state(), fitrun::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Events(second), HasSubstr("its workload's memory is measured first"));
  probe_->Release();
  WaitForState(first, fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(probe_->calls(), 1);
}

TEST_F(JobManagerCalibrationTest, DryRunNeverWaitsAndSaysItIsCalibrating) {
  Start(64LL << 20);
  probe_->Hold();
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> plan = jobs_.manager().DryRunPlan(MlpSpec());
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::string reasons;
  for (const std::string& r : plan->second.reasons()) absl::StrAppend(&reasons, r, "\n");
  EXPECT_THAT(reasons, HasSubstr("measuring memory"));
  EXPECT_THAT(reasons, HasSubstr("analytic estimate, an upper bound"));
  probe_->Release();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (calibrator_->Find(MlpSpec(), "").state != MemoryCalibrator::State::kReady && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  plan = jobs_.manager().DryRunPlan(MlpSpec());
  ASSERT_TRUE(plan.ok()) << plan.status();
  reasons.clear();
  for (const std::string& r : plan->second.reasons()) absl::StrAppend(&reasons, r, "\n");
  EXPECT_THAT(reasons, HasSubstr("memory estimate: calibrated"));
  EXPECT_EQ(probe_->calls(), 1);
}

TEST_F(JobManagerCalibrationTest, ARoomyAnalyticPlanLaunchesAtOnceAndItsRunJoinsTheLaterSweep) {
  Start(1LL << 30);  // the mlp at 512 per rank: well under half of 1 GiB even by the analytic estimate
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec(1024));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), fitrun::v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  const fitrun::v1::Job running = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(probe_->calls(), 0);
  EXPECT_THAT(Events(job->id()), ::testing::Not(HasSubstr("measuring")));
  EXPECT_THAT(absl::StrJoin(running.plan().reasons(), "\n"),
              HasSubstr("no memory probe: the analytic estimate, an upper bound, predicts"));

  RunRanksToTheEnd(job->id(), MlpPeakBytes(512));
  WaitForState(job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(probe_->calls(), 0);
  // The run's peak waits for the workload's first sweep, and corrects it like any later run.
  const absl::StatusOr<Calibration> swept = calibrator_->CalibrateNow(MlpSpec(1024), {.max_batch = 512});
  ASSERT_TRUE(swept.ok()) << swept.status();
  ASSERT_EQ(swept->runs.size(), 1u);
  EXPECT_EQ(swept->runs[0].batch, 512);
  EXPECT_EQ(swept->runs[0].peak_bytes, MlpPeakBytes(512));
}

TEST_F(JobManagerCalibrationTest, ABatchBeyondTheMeasuredOnesIsMeasuredBeforeLaunch) {
  // A linear curve: the sweep stops once its slope is steady (about micro-batch 512), far below the
  // 8192 a rank of this job takes on 1 GiB devices.
  Start(1LL << 30, [](int64_t b) { return 5'000'000 + 10'000 * b; });
  // Measured already (a roomy plan of an unmeasured workload would launch on its analytic estimate).
  ASSERT_TRUE(calibrator_->CalibrateNow(MlpSpec(16384), {.max_batch = 8192, .max_bytes = 1LL << 30}).ok());
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec(16384));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  const fitrun::v1::Job running = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.plan().per_device_batch(), 8192);
  EXPECT_THAT(Events(job->id()), HasSubstr("measuring the peak at per-device batch 8192 before launch"));
  EXPECT_THAT(Events(job->id()), HasSubstr("extrapolated beyond the largest measured micro-batch"));
  EXPECT_EQ(probe_->measured_batches().back(), 8192);
  EXPECT_EQ(probe_->calls(), 2);  // the sweep, then the one measurement
  bool measured = false;
  for (const std::string& r : running.plan().reasons()) measured |= absl::StrContains(r, "measured at micro-batch 8192");
  EXPECT_TRUE(measured);
}

TEST_F(JobManagerCalibrationTest, WhenTheMeasurementSaysItDoesNotFitThePlanStepsDown) {
  // Steady at 10 KB per sample up to 4096, then much steeper: the extrapolation from the sweep says
  // 8192 fits 200 MiB devices, the measurement says it does not.
  auto peak = [](int64_t b) -> int64_t {
    return b <= 4096 ? 5'000'000 + 10'000 * b : 5'000'000 + 10'000 * 4096 + 100'000 * (b - 4096);
  };
  Start(200LL << 20, peak);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec(16384));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(10)));
  const fitrun::v1::Job running = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  const int64_t chosen = running.plan().per_device_batch();
  EXPECT_LT(chosen, 8192);
  EXPECT_EQ(running.plan().per_device_batch() * running.plan().grad_accum_steps() * 2, 16384);
  // Whatever it chose really fits: its true peak, with the margin, is within the usable memory.
  EXPECT_LE(peak(chosen) * 1.03, running.plan().usable_bytes());
  EXPECT_THAT(Events(job->id()), HasSubstr("measuring the peak at per-device batch 8192"));
}

TEST_F(JobManagerCalibrationTest, AWrongStoredCalibrationIsCorrectedByOneRun) {
  // The stored calibration says the mlp needs half of what it does (a stale or doctored cache).
  const fitrun::v1::JobSpec spec = MlpSpec(512);
  {
    std::ofstream out(jobs_.state_dir() / "memory_calibration.tsv");
    out << "sweep\t" << CalibrationKey(spec, "") << "\t2678824\t";
    for (int64_t b = 1; b <= 1024; b *= 2) out << (b > 1 ? "," : "") << b << ":" << MlpPeakBytes(b) / 2;
    out << "\tdoctored\n";
  }
  Start(4LL << 30);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  const fitrun::v1::Job running = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  const int64_t batch = running.plan().per_device_batch();
  ASSERT_EQ(batch, 256);
  const int64_t predicted = running.plan().predicted().total_bytes();
  EXPECT_LT(predicted, MlpPeakBytes(batch));  // wrong, as stored

  RunRanksToTheEnd(job->id(), MlpPeakBytes(batch));
  const fitrun::v1::Job done = WaitForState(job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (jobs_.manager().Get(job->id())->attempt_history(0).measured_peak_bytes() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const fitrun::v1::AttemptRecord attempt = jobs_.manager().Get(job->id())->attempt_history(0);
  EXPECT_EQ(attempt.predicted_peak_bytes(), predicted);
  EXPECT_EQ(attempt.measured_peak_bytes(), MlpPeakBytes(batch));
  // One ratio per rank, above 1: the plan promised too little.
  ASSERT_EQ(jobs_.metrics().prediction_ratios().size(), 2u);
  EXPECT_NEAR(jobs_.metrics().prediction_ratios()[0], static_cast<double>(MlpPeakBytes(batch)) / predicted, 1e-9);
  EXPECT_GT(jobs_.metrics().prediction_ratios()[0], 1.1);

  // The next plan of the workload covers what the run measured.
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> next = jobs_.manager().DryRunPlan(spec);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->second.per_device_batch(), batch);
  EXPECT_GE(next->second.predicted().total_bytes() - next->second.predicted().safety_margin_bytes(),
            MlpPeakBytes(batch));
  std::string reasons;
  for (const std::string& r : next->second.reasons()) absl::StrAppend(&reasons, r, "\n");
  EXPECT_THAT(reasons, HasSubstr("real runs peaked at up to 2.00x the measurements"));
  EXPECT_EQ(probe_->calls(), 0);
  (void)done;
}

TEST_F(JobManagerCalibrationTest, ARankThatReportsNoProgressIsMeasuredByItsFinishedPeak) {
  // A plain script reports no progress; its supervisor reads the whole run's peak from the
  // preloaded allocator and sends it with RankFinished.
  Start(4LL << 30);
  ASSERT_TRUE(calibrator_->CalibrateNow(MlpSpec(512), {.max_batch = 256, .max_bytes = 4LL << 30}).ok());
  const std::string id = jobs_.manager().Submit(MlpSpec(512))->id();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  const int64_t batch = WaitForState(id, fitrun::v1::JOB_STATE_RUNNING).plan().per_device_batch();
  for (int rank = 0; rank < 2; ++rank) {
    fitrun::v1::WorkerReport finished;
    finished.mutable_finished()->set_peak_bytes(MlpPeakBytes(batch) + rank);
    jobs_.manager().OnWorkerReport(WorkerKey{id, 1, rank}, finished);
  }
  jobs_.launcher().Exit(0, 0);
  jobs_.launcher().Exit(1, 0);
  WaitForState(id, fitrun::v1::JOB_STATE_SUCCEEDED);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (jobs_.manager().Get(id)->attempt_history(0).measured_peak_bytes() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(jobs_.manager().Get(id)->attempt_history(0).measured_peak_bytes(), MlpPeakBytes(batch) + 1);
  EXPECT_EQ(jobs_.metrics().prediction_ratios().size(), 2u);
  ASSERT_EQ(calibrator_->Find(MlpSpec(512), "").calibration.runs.size(), 1u);
  EXPECT_EQ(calibrator_->Find(MlpSpec(512), "").calibration.runs[0].peak_bytes, MlpPeakBytes(batch) + 1);
}

TEST_F(JobManagerCalibrationTest, AnAttemptThatRanOutOfMemoryTeachesNothingAboutWhatFits) {
  Start(4LL << 30);
  ASSERT_TRUE(calibrator_->CalibrateNow(MlpSpec(512), {.max_batch = 256, .max_bytes = 4LL << 30}).ok());
  const std::string id = jobs_.manager().Submit(MlpSpec(512))->id();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  WaitForState(id, fitrun::v1::JOB_STATE_RUNNING);
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(5);
  progress.mutable_progress()->set_peak_bytes(1 << 30);
  jobs_.manager().OnWorkerReport(WorkerKey{id, 1, 0}, progress);
  fitrun::v1::WorkerReport oom;
  oom.mutable_oom()->set_step(6);
  oom.mutable_oom()->set_per_device_batch(256);
  jobs_.manager().OnWorkerReport(WorkerKey{id, 1, 1}, oom);
  jobs_.launcher().Exit(0, -1, 15);
  jobs_.launcher().Exit(1, 3);
  WaitForState(id, fitrun::v1::JOB_STATE_RUNNING);  // re-planned and launched again
  EXPECT_EQ(jobs_.manager().Get(id)->attempt_history(0).measured_peak_bytes(), 0);
  EXPECT_TRUE(jobs_.metrics().prediction_ratios().empty());
  EXPECT_TRUE(calibrator_->Find(MlpSpec(512), "").calibration.runs.empty());
}

// A rank's figures are its account's word: what fitrund measured itself bounds them, and what
// passes calibrates that account's plans, never another's. "nobody" stands for a user's account.
TEST_F(JobManagerCalibrationTest, ReportedPeaksTeachOnlyTheirOwnAccountAndNeverBeyondWhatFitrundMeasured) {
  Start(4LL << 30);
  const SweepLimits limits{.max_batch = 256, .max_bytes = 4LL << 30};
  ASSERT_TRUE(calibrator_->CalibrateNow(MlpSpec(512), limits).ok());
  ASSERT_TRUE(calibrator_->CalibrateNow(MlpSpec(512), limits, "nobody").ok());
  auto run_as_nobody = [this](int first_handle, int64_t peak, int64_t cgroup_peak) {
    absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec(512), "mallory", "", "nobody");
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(jobs_.launcher().WaitForLaunches(first_handle + 2, absl::Seconds(5)));
    WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
    for (int rank = 0; rank < 2; ++rank) {
      fitrun::v1::WorkerReport progress;
      progress.mutable_progress()->set_step(10);
      progress.mutable_progress()->set_total_steps(10);
      progress.mutable_progress()->set_peak_bytes(peak);
      jobs_.manager().OnWorkerReport(WorkerKey{job->id(), 1, rank}, progress);
      fitrun::v1::WorkerReport finished;
      finished.mutable_finished()->set_steps(10);
      jobs_.manager().OnWorkerReport(WorkerKey{job->id(), 1, rank}, finished);
      WorkerExit exit;
      exit.host_memory_peak_bytes = cgroup_peak;
      jobs_.launcher().ExitWith(first_handle + rank, exit);
    }
    WaitForState(job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
    return job->id();
  };
  // A forged 60 GB peak on a 4 GiB device, and 3 GiB where the attempt's cgroup saw 1 GiB in all.
  const std::string forged = run_as_nobody(0, 60LL << 30, 8LL << 30);
  EXPECT_THAT(Events(forged), HasSubstr("more than its device has"));
  const std::string beyond_cgroup = run_as_nobody(2, 3LL << 30, 1LL << 30);
  EXPECT_THAT(Events(beyond_cgroup), HasSubstr("more than the attempt's processes held together"));
  EXPECT_TRUE(calibrator_->Find(MlpSpec(512), "nobody").calibration.runs.empty()) << "neither was learned from";
  // A possible peak, twice the probe's: nobody's next plans take it; everyone else's do not.
  const int64_t batch = jobs_.manager().Get(forged)->plan().per_device_batch();
  run_as_nobody(4, 2 * MlpPeakBytes(batch), 8LL << 30);
  EXPECT_EQ(calibrator_->Find(MlpSpec(512), "nobody").calibration.runs.size(), 1u);
  EXPECT_TRUE(calibrator_->Find(MlpSpec(512), "").calibration.runs.empty());
  auto reasons = [this](const std::string& run_as) {
    absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> plan =
        jobs_.manager().DryRunPlan(MlpSpec(512), run_as);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? absl::StrJoin(plan->second.reasons(), "\n") : "";
  };
  EXPECT_THAT(reasons("nobody"), HasSubstr("real runs peaked at up to"));
  EXPECT_THAT(reasons(""), ::testing::Not(HasSubstr("real runs peaked")));
}

}  // namespace
}  // namespace fitrun::server
