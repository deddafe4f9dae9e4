#include "server/core/memory_calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/synchronization/notification.h"
#include "server/core/estimator.h"
#include "server/core/fakes.h"
#include "server/core/job_spec.h"
#include "server/core/planner.h"
#include "server/core/test_specs.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

fitrun::v1::JobSpec MlpSpec() { return MlpTestSpec(256); }

ProbeResult MlpProbe() { return MlpProbeResult(/*small_batch=*/2, /*large_batch=*/8); }

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return (std::filesystem::path(dir != nullptr ? dir : "/tmp") / name).string();
}

TEST(CalibrationKeyTest, ChangesWithWhatChangesMemoryOnly) {
  const fitrun::v1::JobSpec base = MlpSpec();
  fitrun::v1::JobSpec other_batch = base;
  other_batch.set_global_batch_size(512);
  other_batch.mutable_resources()->set_max_devices(1);
  other_batch.set_max_steps(3);
  EXPECT_EQ(CalibrationKey(base), CalibrationKey(other_batch));

  fitrun::v1::JobSpec adam = base;
  adam.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAM);
  fitrun::v1::JobSpec no_momentum = base;
  no_momentum.mutable_optimizer()->set_momentum(0);
  fitrun::v1::JobSpec bf16 = base;
  bf16.set_precision(fitrun::v1::PRECISION_BF16);
  fitrun::v1::JobSpec cnn = base;
  cnn.mutable_model()->set_builtin("cnn");
  for (const auto& changed : {adam, no_momentum, bf16, cnn}) {
    EXPECT_NE(CalibrationKey(base), CalibrationKey(changed)) << CalibrationKey(changed);
  }

  fitrun::v1::JobSpec gpt = base;
  gpt.mutable_model()->set_builtin("gpt");
  gpt.mutable_model()->mutable_gpt()->set_layers(2);
  gpt.mutable_model()->mutable_gpt()->set_hidden(64);
  fitrun::v1::JobSpec wider = gpt;
  wider.mutable_model()->mutable_gpt()->set_hidden(128);
  EXPECT_NE(CalibrationKey(gpt), CalibrationKey(wider));
}

TEST(CalibrationKeyTest, ARewrittenTorchScriptFileIsANewModel) {
  const std::string path = TempPath("model.pt");
  { std::ofstream(path) << "one"; }
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.mutable_model()->set_torchscript(path);
  const std::string before = CalibrationKey(spec);
  { std::ofstream(path) << "a longer model"; }
  EXPECT_NE(before, CalibrationKey(spec));
}

TEST(CalibratedProfileTest, EstimateIsTheMeasuredLineWithItsBreakdown) {
  const fitrun::v1::JobSpec spec = MlpSpec();
  const ModelProfile profile = CalibratedProfile(*ProfileFor(spec), MlpProbe());
  EXPECT_TRUE(profile.calibrated);
  EXPECT_EQ(profile.activation_bytes_per_sample, 5192);
  EXPECT_THAT(profile.memory_source, HasSubstr("calibrated"));

  EstimatorOptions options;
  const fitrun::v1::MemoryBreakdown m = EstimateRankMemory(profile, spec, 64, options);
  const int64_t measured_line = 12322992 + 5192 * 64;
  // Model states from arithmetic (SGD with momentum: weights, gradients, one buffer, buckets).
  EXPECT_EQ(m.weights_bytes(), 2678824);
  EXPECT_EQ(m.optimizer_state_bytes(), 2678824);
  EXPECT_EQ(m.activations_bytes(), 5192 * 64);
  EXPECT_EQ(m.workspace_bytes(), 0);
  EXPECT_EQ(m.ddp_buckets_bytes(), 4);  // gradients are bucket views: only the loss slot is extra
  EXPECT_EQ(m.framework_overhead_bytes(), 12322992 - 3 * 2678824 - 4);
  EXPECT_EQ(m.total_bytes() - m.safety_margin_bytes(), measured_line);
  EXPECT_NEAR(static_cast<double>(m.total_bytes()) / measured_line, 1 + options.calibrated_safety_margin, 1e-6);

  // The recovery path scales the per-sample bytes after an out-of-memory error; that scales the
  // batch-dependent part of a calibrated estimate as it does an analytic one.
  ModelProfile scaled = profile;
  scaled.activation_bytes_per_sample *= 2;
  EXPECT_EQ(EstimateRankMemory(scaled, spec, 64).activations_bytes(), 2 * 5192 * 64);
}

TEST(CalibratedProfileTest, TheSmallBatchLineIsAFloor) {
  // The cnn with Adam, as measured: a plateau of 28.6 MB at small batches (the optimizer step's
  // temporaries), then 19.3 MB + 558 KB per sample once activations dominate.
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.mutable_model()->set_builtin("cnn");
  ProbeResult probe;
  probe.fixed_bytes = 19272112;
  probe.per_sample_bytes = 557640;
  probe.small_fixed_bytes = 28155824;
  probe.small_per_sample_bytes = 120288;
  probe.model_state_bytes = 4799528;
  const ModelProfile profile = CalibratedProfile(*ProfileFor(spec), probe);
  const auto without_margin = [&](int64_t b) {
    const fitrun::v1::MemoryBreakdown m = EstimateRankMemory(profile, spec, b);
    return m.total_bytes() - m.safety_margin_bytes();
  };
  EXPECT_EQ(without_margin(4), 28155824 + 120288 * 4);
  EXPECT_EQ(without_margin(64), 19272112 + 557640 * 64);
  EXPECT_EQ(EstimateRankMemory(profile, spec, 64).activations_bytes(), 557640 * 64);
}

TEST(CalibratedProfileTest, CalibrationMakesThePlannerUseTheMeasuredLine) {
  fitrun::v1::JobSpec spec = MlpSpec();
  spec.mutable_resources()->set_max_devices(1);
  spec.set_global_batch_size(1024);
  // 16 MiB less 10% headroom: the analytic estimate (40 MiB of fixed overheads) fits nothing, the
  // measured line fits a large batch.
  const std::vector<DeviceCapacity> devices = {{"cpu:0", 16LL << 20}};
  EXPECT_FALSE(PlanJob(spec, *ProfileFor(spec), devices).ok());
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, CalibratedProfile(*ProfileFor(spec), MlpProbe()), devices);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 256);  // (0.9 * 16 MiB / 1.03 - 12.3 MB) / 5192 B = 450 -> divisor 256
  bool explained = false;
  for (const std::string& r : plan->reasons()) explained |= r.find("memory estimate: calibrated") != std::string::npos;
  EXPECT_TRUE(explained);
}

TEST(MemoryCalibratorTest, ProbesOnceAndServesTheCache) {
  FakeMemoryProbe probe(MlpProbe());
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  const fitrun::v1::JobSpec spec = MlpSpec();
  EXPECT_EQ(calibrator->Find(spec).state, MemoryCalibrator::State::kMissing);

  absl::StatusOr<ModelProfile> analytic = calibrator->ProfileFor(spec, /*probe_if_missing=*/false);
  ASSERT_TRUE(analytic.ok());
  EXPECT_FALSE(analytic->calibrated);
  EXPECT_EQ(probe.calls(), 0);

  absl::StatusOr<ModelProfile> calibrated = calibrator->ProfileFor(spec, /*probe_if_missing=*/true);
  ASSERT_TRUE(calibrated.ok());
  EXPECT_TRUE(calibrated->calibrated);
  EXPECT_EQ(calibrated->calibrated_fixed_bytes, 12322992);
  fitrun::v1::JobSpec same_model = spec;
  same_model.set_global_batch_size(64);
  EXPECT_TRUE(calibrator->ProfileFor(same_model, true)->calibrated);
  EXPECT_EQ(calibrator->Find(same_model).state, MemoryCalibrator::State::kReady);
  EXPECT_EQ(probe.calls(), 1);
}

TEST(MemoryCalibratorTest, TheCacheFileSurvivesARestart) {
  const std::string path = TempPath("calibration.tsv");
  std::filesystem::remove(path);
  const fitrun::v1::JobSpec spec = MlpSpec();
  {
    FakeMemoryProbe probe(MlpProbe());
    auto calibrator = *MemoryCalibrator::Create({path}, &probe);
    ASSERT_TRUE(calibrator->Calibrate(spec).ok());
  }
  { std::ofstream(path, std::ios::app) << "torn line without fields"; }  // a crash mid-append
  FakeMemoryProbe probe;
  auto restarted = *MemoryCalibrator::Create({path}, &probe);
  const MemoryCalibrator::Lookup lookup = restarted->Find(spec);
  ASSERT_EQ(lookup.state, MemoryCalibrator::State::kReady);
  EXPECT_EQ(lookup.result.fixed_bytes, 12322992);
  EXPECT_EQ(lookup.result.per_sample_bytes, 5192);
  EXPECT_EQ(lookup.result.model_state_bytes, 2678824);
  EXPECT_EQ(lookup.result.large_batch, 8);
  EXPECT_EQ(probe.calls(), 0);
}

TEST(MemoryCalibratorTest, AFailedProbeFallsBackToTheAnalyticProfileAndIsNotRepeated) {
  FakeMemoryProbe probe;
  probe.Fail(absl::InvalidArgumentError("spec.model.torchscript: not a module"));
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  const fitrun::v1::JobSpec spec = MlpSpec();
  absl::StatusOr<ModelProfile> profile = calibrator->ProfileFor(spec, true);
  ASSERT_TRUE(profile.ok());
  EXPECT_FALSE(profile->calibrated);
  EXPECT_THAT(profile->memory_source, HasSubstr("the memory probe failed: spec.model.torchscript: not a module"));
  EXPECT_EQ(calibrator->Find(spec).state, MemoryCalibrator::State::kFailed);
  EXPECT_FALSE(calibrator->Calibrate(spec).ok());
  EXPECT_EQ(probe.calls(), 1);
}

TEST(MemoryCalibratorTest, BackgroundCalibrationIsSeenAsMeasuringUntilDone) {
  FakeMemoryProbe probe(MlpProbe());
  probe.Hold();
  auto calibrator = *MemoryCalibrator::Create({}, &probe);
  const fitrun::v1::JobSpec spec = MlpSpec();
  absl::Notification done;
  EXPECT_TRUE(calibrator->StartCalibration(spec, [&done] { done.Notify(); }));
  EXPECT_FALSE(calibrator->StartCalibration(spec, [] { ADD_FAILURE() << "a second probe of the same key"; }));
  EXPECT_EQ(calibrator->Find(spec).state, MemoryCalibrator::State::kMeasuring);
  EXPECT_FALSE(calibrator->ProfileFor(spec, /*probe_if_missing=*/false)->calibrated);

  // A blocking caller of the same key waits for the probe in flight instead of starting another.
  std::atomic<bool> waited_ok{false};
  std::thread waiter([&] { waited_ok = calibrator->Calibrate(spec).ok(); });
  probe.Release();
  done.WaitForNotification();
  waiter.join();
  EXPECT_TRUE(waited_ok);
  EXPECT_EQ(calibrator->Find(spec).state, MemoryCalibrator::State::kReady);
  EXPECT_EQ(probe.calls(), 1);
  EXPECT_EQ(calibrator->probes_run(), 1);
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
