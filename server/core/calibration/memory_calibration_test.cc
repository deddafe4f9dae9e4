#include "server/core/calibration/memory_calibration.h"
#include "server/core/specs/job_specs.h"
#include "server/core/specs/workloads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "server/core/memory/estimator.h"
#include "server/core/specs/job_specs.h"
#include "server/core/memory/planner.h"
#include "server/core/specs/test_specs.h"
#include "server/core/testing/fake_memory_probe.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kMiB = 1LL << 20;

fitrun::v1::JobSpec MlpSpec() { return MlpTestSpec(256); }

// A calibration of the mlp as a sweep would measure it.
Calibration MlpCalibration() {
  Calibration c;
  c.model_state_bytes = 2678824;
  std::vector<MeasuredPeak> points;
  for (int64_t b = 1; b <= 2048; b *= 2) points.push_back({b, MlpPeakBytes(b)});
  c.measured = MemoryCurve(points);
  c.sweep_note = "the peak grows steadily by 11.1 KiB per sample from micro-batch 512 on";
  return c;
}

// Waits until the calibrator has the spec's workload ready (or failed).
MemoryCalibrator::Lookup WaitUntilMeasured(MemoryCalibrator& calibrator, const fitrun::v1::JobSpec& spec) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  MemoryCalibrator::Lookup lookup = calibrator.Find(spec, "");
  while ((lookup.state == MemoryCalibrator::State::kMeasuring || lookup.state == MemoryCalibrator::State::kMissing) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    lookup = calibrator.Find(spec, "");
  }
  return lookup;
}

TEST(CalibrationKeyTest, ChangesWithWhatChangesMemoryOnly) {
  const fitrun::v1::JobSpec base = MlpSpec();
  fitrun::v1::JobSpec other_batch = base;
  other_batch.set_global_batch_size(512);
  other_batch.mutable_resources()->set_max_devices(1);
  other_batch.set_max_steps(3);
  EXPECT_EQ(CalibrationKey(base, ""), CalibrationKey(other_batch, ""));

  fitrun::v1::JobSpec adam = base;
  adam.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAM);
  fitrun::v1::JobSpec no_momentum = base;
  no_momentum.mutable_optimizer()->set_momentum(0);
  fitrun::v1::JobSpec bf16 = base;
  bf16.set_precision(fitrun::v1::PRECISION_BF16);
  fitrun::v1::JobSpec cnn = base;
  cnn.mutable_model()->set_builtin("cnn");
  for (const auto& changed : {adam, no_momentum, bf16, cnn}) {
    EXPECT_NE(CalibrationKey(base, ""), CalibrationKey(changed, "")) << CalibrationKey(changed, "");
  }

  fitrun::v1::JobSpec gpt = base;
  gpt.mutable_model()->set_builtin("gpt");
  gpt.mutable_model()->mutable_gpt()->set_layers(2);
  gpt.mutable_model()->mutable_gpt()->set_hidden(64);
  fitrun::v1::JobSpec wider = gpt;
  wider.mutable_model()->mutable_gpt()->set_hidden(128);
  EXPECT_NE(CalibrationKey(gpt, ""), CalibrationKey(wider, ""));
  // Recomputing the blocks in backward changes the activations' memory: measured on its own.
  fitrun::v1::JobSpec checkpointed = gpt;
  checkpointed.mutable_model()->mutable_gpt()->set_activation_checkpointing(true);
  EXPECT_NE(CalibrationKey(gpt, ""), CalibrationKey(checkpointed, ""));
  // Forbidding it is the same workload as leaving it unset.
  fitrun::v1::JobSpec forbidden = gpt;
  forbidden.mutable_model()->mutable_gpt()->set_activation_checkpointing(false);
  EXPECT_EQ(CalibrationKey(gpt, ""), CalibrationKey(forbidden, ""));
  EXPECT_EQ(CalibrationKey(checkpointed, ""), CalibrationKey(WithActivationCheckpointing(forbidden, true), ""));
}

// A script that applies the plan's strategy: recomputing, and the precision it autocasts to, are
// workloads of their own; forbidding recomputing is the plain script, as for a gpt.
TEST(CalibrationKeyTest, AScriptsStrategyAndPrecisionAreWorkloadsOfTheirOwn) {
  fitrun::v1::JobSpec script;
  script.mutable_script()->add_command("/usr/bin/python3");
  script.mutable_script()->add_command("-c");
  script.mutable_script()->add_command("pass");
  script.mutable_script()->set_applies_strategy(true);
  const fitrun::v1::JobSpec recomputing = WithActivationCheckpointing(script, true);
  EXPECT_TRUE(recomputing.script().activation_checkpointing());
  EXPECT_NE(CalibrationKey(script, ""), CalibrationKey(recomputing, ""));
  EXPECT_EQ(CalibrationKey(script, ""), CalibrationKey(WithActivationCheckpointing(script, false), ""));
  fitrun::v1::JobSpec bf16 = script;
  bf16.set_precision(fitrun::v1::PRECISION_BF16);
  EXPECT_NE(CalibrationKey(script, ""), CalibrationKey(bf16, ""));
  fitrun::v1::JobSpec fp32 = script;
  fp32.set_precision(fitrun::v1::PRECISION_FP32);
  EXPECT_EQ(CalibrationKey(script, ""), CalibrationKey(fp32, ""));
  // Its profile says which it is, so a plan that takes it tells the ranks.
  EXPECT_TRUE(ProfileFor(recomputing)->activation_checkpointing);
  EXPECT_FALSE(ProfileFor(script)->activation_checkpointing);
}

TEST(CalibrationKeyTest, ARewrittenTorchScriptFileIsANewModelWhenSubmittedAgain) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("model.pt");
  { std::ofstream(path) << "one"; }
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.mutable_model()->set_torchscript(path);
  absl::StatusOr<fitrun::v1::JobSpec> before = NormalizeJobSpec(spec);
  ASSERT_TRUE(before.ok()) << before.status();
  { std::ofstream(path) << "a longer model"; }
  // The key of a submitted spec is what was read at submit: rewriting the file changes nothing of it.
  EXPECT_EQ(CalibrationKey(*before, ""), CalibrationKey(*before, ""));
  absl::StatusOr<fitrun::v1::JobSpec> after = NormalizeJobSpec(spec);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(CalibrationKey(*before, ""), CalibrationKey(*after, ""));
}

TEST(CalibratedProfileTest, TheEstimateFollowsTheMeasuredCurveWithItsBreakdown) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  const ModelProfile profile = CalibratedProfile(*ProfileFor(spec), MlpCalibration(), 0.03);
  ASSERT_TRUE(profile.measured.has_value());
  EXPECT_EQ(profile.parameter_count, 669706);
  for (int64_t b : {1, 64, 128, 512, 2048}) {
    const fitrun::v1::MemoryBreakdown m = EstimateRankMemory(profile, spec, b);
    EXPECT_EQ(m.total_bytes() - m.safety_margin_bytes(), MlpPeakBytes(b)) << b;
    EXPECT_EQ(m.weights_bytes(), 2678824);
    EXPECT_EQ(m.optimizer_state_bytes(), 2678824);  // momentum
    EXPECT_EQ(m.weights_bytes() + m.gradients_bytes() + m.optimizer_state_bytes() + m.ddp_buckets_bytes() +
                  m.activations_bytes() + m.framework_overhead_bytes(),
              MlpPeakBytes(b));
  }
  // Between measured batches the chord: never below the convex curve, at most a few percent above.
  const int64_t between = EstimateRankMemory(profile, spec, 700).total_bytes();
  EXPECT_GE(between, MlpPeakBytes(700));
  EXPECT_LE(between, 1.05 * MlpPeakBytes(700));
  EXPECT_THAT(profile.memory_source, HasSubstr("micro-batches 1, 2, 4, ..., 1024, 2048"));
  EXPECT_THAT(profile.memory_source, HasSubstr("grows steadily"));
}

TEST(CalibratedProfileTest, RunsThatPeakHigherScaleTheCurveAndSaySo) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  Calibration c = MlpCalibration();
  c.runs.push_back({512, static_cast<int64_t>(MlpPeakBytes(512) * 1.01)});  // within the tolerance
  EXPECT_EQ(c.RunCorrection(0.03), 1.0);
  c.runs.push_back({256, static_cast<int64_t>(MlpPeakBytes(256) * 1.2)});
  EXPECT_NEAR(c.RunCorrection(0.03), 1.2, 1e-6);
  const ModelProfile profile = CalibratedProfile(*ProfileFor(spec), c, 0.03);
  EXPECT_GE(profile.measured->PeakAt(256), 1.2 * MlpPeakBytes(256) - 1);
  EXPECT_THAT(profile.memory_source, HasSubstr("scaled by 1.20"));
  // And runs that all peak lower scale it down.
  Calibration low = MlpCalibration();
  low.runs.push_back({512, MlpPeakBytes(512) / 2});
  EXPECT_NEAR(low.RunCorrection(0.03), 0.5, 1e-3);
}

TEST(CalibratedProfileTest, CalibrationMakesThePlannerUseTheMeasuredCurve) {
  fitrun::v1::JobSpec spec = MlpTestSpec(1024, 1, 1);
  const ModelProfile profile = CalibratedProfile(*ProfileFor(spec), MlpCalibration(), 0.03);
  // 32 MiB less 10% headroom, less the 3% margin: 29.3 MB of curve, which reaches it between 1024
  // and 2048; the largest divisor of 1024 below that is 1024 itself.
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, profile, {{"cpu:0", 32LL << 20}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 1024);
  EXPECT_EQ(plan->usable_bytes(), static_cast<int64_t>((32LL << 20) * 0.9));
  bool explained = false;
  for (const std::string& r : plan->reasons()) explained |= absl::StrContains(r, "measured at micro-batch 1024");
  EXPECT_TRUE(explained);
}

TEST(MemoryCalibratorTest, SweepsInTheBackgroundOnceAndServesTheResult) {
  FakeMemoryProbe probe(AdamMlpPeakBytes);
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAM);
  EXPECT_EQ(calibrator->Find(spec, "").state, MemoryCalibrator::State::kMissing);
  probe.Hold();
  absl::Notification done;
  ASSERT_TRUE(calibrator->StartCalibration(spec, "", /*max_batch=*/60000, /*max_bytes=*/int64_t{2} << 30,
                                           [&done] { done.Notify(); }));
  EXPECT_EQ(calibrator->Find(spec, "").state, MemoryCalibrator::State::kMeasuring);
  EXPECT_FALSE(calibrator->StartCalibration(spec, "", 60000, int64_t{2} << 30, nullptr));  // queued already
  probe.Release();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const MemoryCalibrator::Lookup lookup = calibrator->Find(spec, "");
  ASSERT_EQ(lookup.state, MemoryCalibrator::State::kReady);
  EXPECT_EQ(probe.calls(), 1);  // one session, every batch in it
  // Adam's flat start did not stop it: it measured well into the steady slope.
  EXPECT_GE(lookup.calibration.measured.largest_batch(), 2048);
  EXPECT_THAT(lookup.calibration.sweep_note, HasSubstr("grows steadily"));
  EXPECT_EQ(lookup.calibration.model_state_bytes, 2678824);
  // No prediction below the truth, none more than 4% above, over the measured range.
  for (int64_t b = 1; b <= lookup.calibration.measured.largest_batch(); b += 1 + b / 16) {
    const int64_t estimate = lookup.calibration.measured.PeakAt(b);
    EXPECT_GE(estimate, AdamMlpPeakBytes(b)) << b;
    EXPECT_LE(estimate, 1.04 * AdamMlpPeakBytes(b) + 1) << b;
  }
  EXPECT_FALSE(calibrator->StartCalibration(spec, "", 60000, int64_t{2} << 30, nullptr));
}

TEST(MemoryCalibratorTest, TheSweepStopsAtTheAskingJobsLargestBatch) {
  FakeMemoryProbe probe(MlpPeakBytes);
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  absl::StatusOr<Calibration> c = calibrator->CalibrateNow(MlpSpec(), SweepLimits{.max_batch = 96});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->measured.largest_batch(), 96);
  for (int64_t b : probe.measured_batches()) EXPECT_LE(b, 96);
}

TEST(MemoryCalibratorTest, AMeasurementJoinsTheCurveAndAFailedOneIsNotRepeated) {
  FakeMemoryProbe probe(MlpPeakBytes);
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  const fitrun::v1::JobSpec spec = MlpSpec();
  EXPECT_FALSE(calibrator->StartMeasurement(spec, "", 5000, 1 << 30, nullptr)) << "not calibrated yet";
  ASSERT_TRUE(calibrator->CalibrateNow(spec, SweepLimits{.max_batch = 2048}).ok());

  absl::Notification measured;
  ASSERT_TRUE(calibrator->StartMeasurement(spec, "", 5000, 1 << 30, [&measured] { measured.Notify(); }));
  EXPECT_FALSE(calibrator->StartMeasurement(spec, "", 5000, 1 << 30, nullptr));
  ASSERT_TRUE(measured.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(calibrator->Measuring(spec, "", 5000));
  const MemoryCurve curve = calibrator->Find(spec, "").calibration.measured;
  EXPECT_TRUE(curve.Measured(5000));
  EXPECT_EQ(curve.PeakAt(5000), MlpPeakBytes(5000));
  EXPECT_FALSE(calibrator->StartMeasurement(spec, "", 5000, 1 << 30, nullptr)) << "measured already";

  // Past the budget: at least just above it, so no plan on a device of that size takes that batch; and
  // never below the estimate before it, which a budget under the device's memory would otherwise make
  // of an extrapolation that was right (the probe ran out at 100 MiB, the batch needs ~550 MB).
  const int64_t extrapolated = calibrator->Find(spec, "").calibration.measured.PeakAt(50000);
  ASSERT_GT(extrapolated, 100 << 20);
  absl::Notification refused;
  ASSERT_TRUE(calibrator->StartMeasurement(spec, "", 50000, 100 << 20, [&refused] { refused.Notify(); }));
  ASSERT_TRUE(refused.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(calibrator->Find(spec, "").calibration.measured.PeakAt(50000), extrapolated);
  EXPECT_GE(extrapolated, MlpPeakBytes(50000));

  probe.Fail(absl::InternalError("the probe broke"));
  absl::Notification failed;
  ASSERT_TRUE(calibrator->StartMeasurement(spec, "", 3000, 1 << 30, [&failed] { failed.Notify(); }));
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(calibrator->Measuring(spec, "", 3000));
  EXPECT_FALSE(calibrator->StartMeasurement(spec, "", 3000, 1 << 30, nullptr));
}

TEST(MemoryCalibratorTest, TheCacheFileSurvivesARestartWithPointsAndRuns) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("calibration-restart.tsv");
  const fitrun::v1::JobSpec spec = MlpSpec();
  {
    FakeMemoryProbe probe(MlpPeakBytes);
    auto calibrator = *MemoryCalibrator::Create({.cache_path = path}, &probe);
    ASSERT_TRUE(calibrator->CalibrateNow(spec, SweepLimits{.max_batch = 1024}).ok());
    absl::Notification measured;
    ASSERT_TRUE(calibrator->StartMeasurement(spec, "", 3000, 1 << 30, [&measured] { measured.Notify(); }));
    ASSERT_TRUE(measured.WaitForNotificationWithTimeout(absl::Seconds(10)));
    calibrator->RecordRun(spec, "", 512, MlpPeakBytes(512) * 2);
  }
  FakeMemoryProbe probe(MlpPeakBytes);
  auto restarted = *MemoryCalibrator::Create({.cache_path = path}, &probe);
  const MemoryCalibrator::Lookup lookup = restarted->Find(spec, "");
  ASSERT_EQ(lookup.state, MemoryCalibrator::State::kReady);
  EXPECT_TRUE(lookup.calibration.measured.Measured(1024));
  EXPECT_TRUE(lookup.calibration.measured.Measured(3000));
  ASSERT_EQ(lookup.calibration.runs.size(), 1u);
  EXPECT_NEAR(lookup.calibration.RunCorrection(0.03), 2.0, 1e-3);
  EXPECT_EQ(probe.calls(), 0);
}

TEST(RecomputingProfileTest, StartsFromTheKeptModelsMeasuredCurveScaledByTheAnalyticRatio) {
  ModelProfile kept;
  kept.parameter_count = 1000;
  kept.activation_bytes_per_sample = 4000;
  kept.measured = MemoryCurve({{1, 110 << 10}, {9, 190 << 10}});  // 100 KiB fixed, 10 KiB a sample
  ModelProfile recomputing;
  recomputing.activation_checkpointing = true;
  recomputing.activation_bytes_per_sample = 1000;
  const ModelProfile derived = RecomputingProfile(kept, recomputing);
  ASSERT_TRUE(derived.measured.has_value());
  EXPECT_EQ(derived.measured->PeakAt(9), (100 << 10) + 9 * (10 << 10) / 4);
  EXPECT_TRUE(derived.activation_checkpointing);
  EXPECT_THAT(derived.memory_source, HasSubstr("its per-sample part scaled by 0.25"));
  // Measured itself, or with nothing measured to start from, it stays as it is.
  ModelProfile measured = recomputing;
  measured.measured = MemoryCurve({{1, 1 << 20}});
  EXPECT_EQ(RecomputingProfile(kept, measured).measured->PeakAt(1), 1 << 20);
  EXPECT_FALSE(RecomputingProfile(ModelProfile{}, recomputing).measured.has_value());
}

TEST(MemoryCalibratorTest, TheSweepsStepTimesReachTheProfileAndSurviveARestart) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("calibration-times.tsv");
  const fitrun::v1::JobSpec spec = MlpSpec();
  {
    FakeMemoryProbe probe(MlpPeakBytes);
    probe.SetStepSeconds([](int64_t batch) { return 0.01 + 0.001 * static_cast<double>(batch); });
    auto calibrator = *MemoryCalibrator::Create({.cache_path = path}, &probe);
    ASSERT_TRUE(calibrator->CalibrateNow(spec, SweepLimits{.max_batch = 1024}).ok());
    absl::StatusOr<ModelProfile> profile = calibrator->ProfileFor(spec, "");
    ASSERT_TRUE(profile.ok()) << profile.status();
    ASSERT_GE(profile->step_times.size(), 2u);
    for (const MeasuredStepTime& t : profile->step_times) EXPECT_DOUBLE_EQ(t.seconds, 0.01 + 0.001 * t.batch);
  }
  FakeMemoryProbe probe(MlpPeakBytes);
  auto restarted = *MemoryCalibrator::Create({.cache_path = path}, &probe);
  absl::StatusOr<ModelProfile> profile = restarted->ProfileFor(spec, "");
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_GE(profile->step_times.size(), 2u);
  for (const MeasuredStepTime& t : profile->step_times) EXPECT_NEAR(t.seconds, 0.01 + 0.001 * t.batch, 1e-6);
  EXPECT_EQ(probe.calls(), 0);
}

TEST(MemoryCalibratorTest, RunsBeforeTheFirstSweepSurviveARestartAndCorrectThatSweep) {
  // A job launched on its analytic estimate: its run is all fitrund knows of the workload.
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("calibration-runs-first.tsv");
  const fitrun::v1::JobSpec spec = MlpSpec();
  {
    FakeMemoryProbe probe(MlpPeakBytes);
    auto calibrator = *MemoryCalibrator::Create({.cache_path = path}, &probe);
    calibrator->RecordRun(spec, "", 512, MlpPeakBytes(512) * 2);
    EXPECT_EQ(calibrator->Find(spec, "").state, MemoryCalibrator::State::kMissing);
  }
  FakeMemoryProbe probe(MlpPeakBytes);
  auto restarted = *MemoryCalibrator::Create({.cache_path = path}, &probe);
  EXPECT_EQ(restarted->Find(spec, "").state, MemoryCalibrator::State::kMissing);
  const absl::StatusOr<Calibration> swept = restarted->CalibrateNow(spec, SweepLimits{.max_batch = 1024});
  ASSERT_TRUE(swept.ok()) << swept.status();
  ASSERT_EQ(swept->runs.size(), 1u);
  EXPECT_NEAR(swept->RunCorrection(0.03), 2.0, 1e-3);
  // And once more after a restart, now from the sweep's line and the run's.
  auto again = *MemoryCalibrator::Create({.cache_path = path}, &probe);
  ASSERT_EQ(again->Find(spec, "").calibration.runs.size(), 1u);
}

// A script's runs are its calibration until a probe sweeps it: each run a point of its curve (the
// larger peak where two ran one batch), kept across a restart; a built-in workload's runs wait for
// its sweep instead. A sweep may still run and takes the runs along.
TEST(MemoryCalibratorTest, AScriptsRunsAreItsCalibrationUntilASweep) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("calibration-script-runs.tsv");
  fitrun::v1::JobSpec script;
  script.mutable_script()->add_command("/usr/bin/python3");
  script.mutable_script()->add_command("train.py");
  script.mutable_script()->set_working_dir("/tmp");
  FakeMemoryProbe probe(MlpPeakBytes);
  {
    auto calibrator = *MemoryCalibrator::Create({.cache_path = path}, &probe);
    EXPECT_EQ(calibrator->Find(script, "").state, MemoryCalibrator::State::kMissing);
    calibrator->RecordRun(script, "", 16, 600 * kMiB);
    calibrator->RecordRun(script, "", 16, 610 * kMiB);
    calibrator->RecordRun(script, "", 8, 400 * kMiB);
    calibrator->RecordRun(MlpSpec(), "", 512, MlpPeakBytes(512));
    EXPECT_EQ(calibrator->Find(MlpSpec(), "").state, MemoryCalibrator::State::kMissing) << "a built-in waits";
  }
  auto restarted = *MemoryCalibrator::Create({.cache_path = path}, &probe);
  const MemoryCalibrator::Lookup lookup = restarted->Find(script, "");
  ASSERT_EQ(lookup.state, MemoryCalibrator::State::kReady);
  EXPECT_TRUE(lookup.calibration.from_runs_only);
  ASSERT_EQ(lookup.calibration.measured.points().size(), 2u);
  EXPECT_EQ(lookup.calibration.measured.PeakAt(16), 610 * kMiB);
  EXPECT_EQ(lookup.calibration.measured.PeakAt(12), 505 * kMiB) << "on the chord between two runs";
  absl::StatusOr<ModelProfile> profile = restarted->ProfileFor(script, "");
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_FALSE(profile->Unmeasured());
  EXPECT_THAT(profile->memory_source, HasSubstr("measured by its runs: 3 run(s)"));
  EXPECT_TRUE(profile->batch_not_plannable.empty());
  // The probe may still sweep it (its runs fit no device it is asked for); the runs join the sweep.
  absl::Notification swept;
  EXPECT_TRUE(restarted->StartCalibration(script, "", 16, 1LL << 30, [&] { swept.Notify(); }));
  ASSERT_TRUE(swept.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const MemoryCalibrator::Lookup after = restarted->Find(script, "");
  EXPECT_FALSE(after.calibration.from_runs_only);
  EXPECT_EQ(after.calibration.runs.size(), 3u);
}

TEST(MemoryCalibratorTest, ATornOrOldLineIsSkippedAndTheFileIsCompacted) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("calibration-torn.tsv");
  const fitrun::v1::JobSpec spec = MlpSpec();
  {
    std::ofstream out(path, std::ios::trunc);
    out << "v2 mlp | optimizer OPTIMIZER_KIND_SGD momentum | PRECISION_FP32\t1\t2\t3\t4\t5\t6\t7\n";
    out << "sweep\t" << CalibrationKey(spec, "") << "\t2678824\t1:100,2:200\tnote\n";
    for (int i = 0; i < 200; ++i) out << "run\t" << CalibrationKey(spec, "") << "\t2\t" << 200 + i << "\n";
    out << "point\t" << CalibrationKey(spec, "") << "\t4";  // torn
  }
  FakeMemoryProbe probe(MlpPeakBytes);
  {
    auto calibrator = *MemoryCalibrator::Create({.cache_path = path}, &probe);
    const MemoryCalibrator::Lookup lookup = calibrator->Find(spec, "");
    ASSERT_EQ(lookup.state, MemoryCalibrator::State::kReady);
    EXPECT_EQ(lookup.calibration.measured.largest_batch(), 2);
    EXPECT_EQ(lookup.calibration.runs.size(), 16u);  // the newest
    EXPECT_EQ(lookup.calibration.runs.back().peak_bytes, 399);
  }
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 17) << "one sweep line and the 16 runs kept";
}

TEST(MemoryCalibratorTest, AFailedSweepFallsBackToTheAnalyticProfileAndIsNotRepeated) {
  FakeMemoryProbe probe(MlpPeakBytes);
  probe.Fail(absl::InvalidArgumentError("spec.model.torchscript: not a module"));
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  const fitrun::v1::JobSpec spec = MlpSpec();
  absl::Notification done;
  ASSERT_TRUE(calibrator->StartCalibration(spec, "", 256, 1 << 30, [&done] { done.Notify(); }));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(calibrator->Find(spec, "").state, MemoryCalibrator::State::kFailed);
  absl::StatusOr<ModelProfile> profile = calibrator->ProfileFor(spec, "");
  ASSERT_TRUE(profile.ok());
  EXPECT_FALSE(profile->measured.has_value());
  EXPECT_THAT(profile->memory_source, HasSubstr("the memory probe failed: spec.model.torchscript: not a module"));
  EXPECT_FALSE(calibrator->StartCalibration(spec, "", 256, 1 << 30, nullptr));
  EXPECT_EQ(probe.calls(), 1);
}

// A script that needs more than the probe's budget at micro-batch 1 is measured, not broken: its
// profile fits no batch on a device that size (so the plan may take another strategy, or say what
// batch 1 needs), and nothing asks to fix the script.
TEST(MemoryCalibratorTest, AScriptOverTheBudgetAtBatchOneIsAMeasurementThatFitsNothing) {
  FakeMemoryProbe probe([](int64_t batch) { return (600 + 100 * batch) * (int64_t{1} << 20); });
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  fitrun::v1::JobSpec spec;
  spec.mutable_script()->add_command("/usr/bin/python3");
  spec.mutable_script()->add_command("train.py");
  absl::Notification done;
  ASSERT_TRUE(calibrator->StartCalibration(spec, "", 8, 512 << 20, [&done] { done.Notify(); }));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(calibrator->Find(spec, "").batch_one_over_bytes, 512 << 20);
  absl::StatusOr<ModelProfile> profile = calibrator->ProfileFor(spec, "");
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->batch_not_plannable, "");
  ASSERT_TRUE(profile->measured.has_value());
  EXPECT_GT(profile->measured->PeakAt(1), int64_t{512} << 20);
  EXPECT_GT(profile->measured->PeakAt(8), int64_t{512} << 20);
  EXPECT_THAT(profile->memory_source, HasSubstr("found micro-batch 1 above its budget of 512.0 MiB"));
}

TEST(MemoryCalibratorTest, ProbesOfDifferentWorkloadsQueueAndEachRuns) {
  FakeMemoryProbe probe(MlpPeakBytes);
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  std::atomic<int> finished{0};
  std::vector<fitrun::v1::JobSpec> specs;
  for (auto kind : {fitrun::v1::OPTIMIZER_KIND_SGD, fitrun::v1::OPTIMIZER_KIND_ADAM, fitrun::v1::OPTIMIZER_KIND_ADAMW}) {
    fitrun::v1::JobSpec spec = MlpSpec();
    spec.mutable_optimizer()->set_kind(kind);
    specs.push_back(spec);
    ASSERT_TRUE(calibrator->StartCalibration(spec, "", 64, 1 << 30, [&finished] { ++finished; }));
  }
  for (const auto& spec : specs) EXPECT_EQ(WaitUntilMeasured(*calibrator, spec).state, MemoryCalibrator::State::kReady);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (finished.load() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(finished.load(), 3);
  EXPECT_EQ(calibrator->probes_run(), 3);
}

TEST(CalibrationKeyTest, IsAShortDigestWhateverTheSpecHoldsWithTheAccountInTheClear) {
  fitrun::v1::JobSpec script = MlpSpec();
  script.clear_model();
  script.clear_data();
  script.mutable_script()->add_command("python3");
  script.mutable_script()->add_command("train.py");
  script.mutable_script()->set_working_dir("/srv/alice");
  for (int i = 0; i < 200; ++i) {
    (*script.mutable_script()->mutable_env())["VARIABLE_" + std::to_string(i)] = std::string(300, 'x');
  }
  const std::string key = CalibrationKey(script, "alice");
  EXPECT_LT(key.size(), 100u) << key;
  EXPECT_THAT(key, Not(HasSubstr("VARIABLE_")));
  EXPECT_EQ(AccountOfCalibrationKey(key), "alice");
  EXPECT_EQ(AccountOfCalibrationKey(CalibrationKey(script, "")), "");
  (*script.mutable_script()->mutable_env())["VARIABLE_0"] = "y";
  EXPECT_NE(CalibrationKey(script, "alice"), key);
}

// A workload of its own for each n: a gpt n + 1 times 8 wide.
fitrun::v1::JobSpec NthWorkload(int n) {
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.mutable_model()->set_builtin("gpt");
  spec.mutable_model()->mutable_gpt()->set_layers(1);
  spec.mutable_model()->mutable_gpt()->set_heads(1);
  spec.mutable_model()->mutable_gpt()->set_hidden(8 * (n + 1));
  spec.mutable_model()->mutable_gpt()->set_context(8);
  return spec;
}

TEST(MemoryCalibratorTest, OneAccountQueuesAFewProbesAtOnceAndOthersStillQueueTheirs) {
  FakeMemoryProbe probe(MlpPeakBytes);
  MemoryCalibrator::Options options;
  options.max_queued_per_account = 2;
  auto calibrator = *MemoryCalibrator::Create(options, &probe);
  probe.Hold();
  // The first is taken off the queue by the probe thread (and waits in the held probe).
  ASSERT_TRUE(calibrator->StartCalibration(NthWorkload(0), "mallory", 64, 1 << 30, nullptr));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (probe.probed().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  int queued = 0;
  for (int i = 1; i < 100; ++i) queued += calibrator->StartCalibration(NthWorkload(i), "mallory", 64, 1 << 30, nullptr);
  EXPECT_EQ(queued, 2);
  EXPECT_EQ(calibrator->Find(NthWorkload(50), "mallory").state, MemoryCalibrator::State::kMissing)
      << "not queued: asked again later";
  EXPECT_TRUE(calibrator->StartCalibration(NthWorkload(0), "alice", 64, 1 << 30, nullptr));
  probe.Release();
}

TEST(MemoryCalibratorTest, OneAccountKeepsABoundedNumberOfWorkloadsAndNoOtherAccountsAreTouched) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  FakeMemoryProbe probe(MlpPeakBytes);
  MemoryCalibrator::Options options;
  options.max_workloads_per_account = 3;
  options.cache_path = dir.Join("bounded-workloads.tsv");
  auto calibrator = *MemoryCalibrator::Create(options, &probe);
  auto measure = [](MemoryCalibrator& c, const fitrun::v1::JobSpec& spec, const std::string& run_as) {
    absl::Notification done;
    ASSERT_TRUE(c.StartCalibration(spec, run_as, 64, 1 << 30, [&done] { done.Notify(); }));
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  };
  measure(*calibrator, NthWorkload(0), "alice");
  for (int i = 0; i < 6; ++i) measure(*calibrator, NthWorkload(i), "mallory");
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(calibrator->Find(NthWorkload(i), "mallory").state,
              i < 3 ? MemoryCalibrator::State::kMissing : MemoryCalibrator::State::kReady) << i;
  }
  EXPECT_EQ(calibrator->Find(NthWorkload(0), "alice").state, MemoryCalibrator::State::kReady);
  // The same after a restart on the cache file.
  auto restarted = *MemoryCalibrator::Create(options, &probe);
  EXPECT_EQ(restarted->Find(NthWorkload(2), "mallory").state, MemoryCalibrator::State::kMissing);
  EXPECT_EQ(restarted->Find(NthWorkload(5), "mallory").state, MemoryCalibrator::State::kReady);
  EXPECT_EQ(restarted->Find(NthWorkload(0), "alice").state, MemoryCalibrator::State::kReady);
}

TEST(CallbackGuardTest, CallbacksDoNothingOnceTheGuardIsGone) {
  int calls = 0;
  std::function<void()> callback;
  {
    CallbackGuard guard;
    callback = guard.Wrap([&calls] { ++calls; });
    callback();
  }
  callback();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace fitrun::server
