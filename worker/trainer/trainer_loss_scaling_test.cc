// Loss scaling inside the training loop, on CPU in fp32 (the path fp16 takes on CUDA devices): a
// power-of-two scale changes no bit of training, and an overflowing scale skips steps and backs off.
#include <ATen/ATen.h>

#include "gtest/gtest.h"
#include "worker/testing/trainer_options.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/trainer_testing.h"

namespace fitrun::worker {
namespace {

absl::StatusOr<TrainResult> Train(const TrainerOptions& options, FakeProgressSink& sink) {
  fitrun::v1::ModelSpec spec;
  spec.set_builtin("mlp");
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(spec, options.seed);
  if (!model.ok()) return model.status();
  LocalGradientSynchronizer local;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(options, *model, SyntheticSet(512, 5), std::nullopt, &local, &sink);
  if (!trainer.ok()) return trainer.status();
  return (*trainer)->Run();
}

TEST(TrainerLossScalingTest, PowerOfTwoScaleLeavesFp32TrainingBitwiseUnchanged) {
  FakeProgressSink plain_sink, scaled_sink;
  absl::StatusOr<TrainResult> plain = Train(testing::SmallTrainerOptions(), plain_sink);
  TrainerOptions options = testing::SmallTrainerOptions();
  options.loss_scaling = GradScaler::Options();
  absl::StatusOr<TrainResult> scaled = Train(options, scaled_sink);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_EQ(scaled->skipped_steps, 0);
  EXPECT_EQ(scaled->loss_scale, 65536.0);
  EXPECT_EQ(scaled->final_loss, plain->final_loss);
  EXPECT_EQ(scaled->parameter_checksum, plain->parameter_checksum);
}

TEST(TrainerLossScalingTest, OverflowingScaleSkipsStepsAndBacksOffUntilTrainingProceeds) {
  TrainerOptions options = testing::SmallTrainerOptions();
  // 1e300 and 1e150 overflow float32 in the scaled loss itself; 1e300 * 1e-150 * 1e-150 is about 1.
  options.loss_scaling = GradScaler::Options{1e300, 2.0, 1e-150, 2000};
  FakeProgressSink sink;
  absl::StatusOr<TrainResult> result = Train(options, sink);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->skipped_steps, 2);
  EXPECT_NEAR(result->loss_scale, 1.0, 1e-6);
  // After the two skipped steps training proceeds.
  const auto& progress = sink.progress();
  ASSERT_EQ(progress.size(), 12u);
  EXPECT_LT(progress.back().loss, progress.front().loss);
  int skip_logs = 0;
  for (const std::string& line : sink.logs()) skip_logs += line.find("optimizer step skipped") != std::string::npos;
  EXPECT_EQ(skip_logs, 2);
}

}  // namespace
}  // namespace fitrun::worker
