// Checkpoints seen from the training loop: resume continues the uninterrupted run exactly, a failed
// write does not stop training, and bf16 autocast trains.
#include <ATen/ATen.h>
#include <sys/stat.h>

#include <cstdio>

#include "gtest/gtest.h"
#include "proto/contract/testing/temp_dir.h"
#include "worker/checkpoint/checkpoint_store.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/trainer_testing.h"

namespace fitrun::worker {
namespace {

TrainerOptions Options(CheckpointStore* store) {
  TrainerOptions options;
  options.per_device_batch = 32;
  options.learning_rate = 0.05;
  options.total_steps = 12;
  options.steps_per_epoch = 5;  // the resume point (step 4) and the end cross epoch boundaries
  options.seed = 3;
  options.optimizer.set_momentum(0.9);
  options.progress_interval = absl::ZeroDuration();
  options.checkpoints = store;
  options.checkpoint_every_steps = 4;
  return options;
}

std::vector<double> Losses(const FakeProgressSink& sink) {
  std::vector<double> losses;
  for (const StepProgress& p : sink.progress()) losses.push_back(p.loss);
  return losses;
}

// Stops its trainer once a given step has been reported: the process "dies" after that step.
class StopAfter final : public ProgressSink {
 public:
  explicit StopAfter(int64_t step) : step_(step) {}
  void OnProgress(const StepProgress& p) override {
    if (p.step == step_) trainer->RequestStop();
  }
  void OnLog(const std::string&) override {}
  void Flush(absl::Duration) override {}
  Trainer* trainer = nullptr;

 private:
  int64_t step_;
};

TEST(TrainerCheckpointTest, ResumeReproducesTheUninterruptedLossTrajectory) {
  const TensorDataset train = SyntheticSet(256);
  LocalGradientSynchronizer local;
  const contract::TempDir dir;
  ASSERT_TRUE(dir.ok());

  auto full_store = CheckpointStore::Create({dir.Join("full"), 2});
  ASSERT_TRUE(full_store.ok());
  FakeProgressSink full_sink;
  auto full = Trainer::Create(Options(full_store->get()), MlpFromSeed(1), train, std::nullopt, &local, &full_sink);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE((*full)->Run().ok());
  const std::vector<double> uninterrupted = Losses(full_sink);
  ASSERT_EQ(uninterrupted.size(), 12u);
  // Steps 4 and 8 and the end; keep_last 2 leaves 8 and 12.
  std::vector<int64_t> saved_steps;
  for (const CheckpointNotice& c : full_sink.checkpoints()) saved_steps.push_back(c.step);
  EXPECT_EQ(saved_steps, (std::vector<int64_t>{4, 8, 12}));
  EXPECT_EQ((*full_store)->Steps(), (std::vector<int64_t>{12, 8}));

  // The interrupted run dies after step 6: its newest checkpoint is step 4.
  auto store = CheckpointStore::Create({dir.Join("interrupted"), 2});
  ASSERT_TRUE(store.ok());
  StopAfter stop(6);
  auto first = Trainer::Create(Options(store->get()), MlpFromSeed(1), train, std::nullopt, &local, &stop);
  ASSERT_TRUE(first.ok());
  stop.trainer = first->get();
  EXPECT_EQ((*first)->Run().status().code(), absl::StatusCode::kCancelled);
  ASSERT_EQ((*store)->Steps(), (std::vector<int64_t>{4}));

  // A new process: other initial weights, then the checkpoint.
  FakeProgressSink resumed_sink;
  auto resumed = Trainer::Create(Options(store->get()), MlpFromSeed(77), train, std::nullopt, &local, &resumed_sink);
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE((*resumed)->ResumeFrom(**store, 4).ok());
  EXPECT_EQ((*resumed)->start_step(), 4);
  absl::StatusOr<TrainResult> result = (*resumed)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<double> after = Losses(resumed_sink);
  ASSERT_EQ(after.size(), 8u);
  EXPECT_EQ(resumed_sink.progress().front().step, 5);
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i], uninterrupted[4 + i]) << "step " << 5 + i;
  }
}

// The temporary file name of step 8 is taken by a directory, so that save fails (as on a read-only
// directory or a full disk): a failed-checkpoint notice naming the step, training goes on, the step-4
// checkpoint stays.
TEST(TrainerCheckpointTest, FailedSaveIsLoggedAndTrainingContinues) {
  const TensorDataset train = SyntheticSet(256);
  LocalGradientSynchronizer local;
  const contract::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = CheckpointStore::Create({dir.Join("failing"), 1});
  ASSERT_TRUE(store.ok());
  ASSERT_EQ(::mkdir(((*store)->PathFor(8) + ".tmp").c_str(), 0755), 0);
  FakeProgressSink sink;
  TrainerOptions options = Options(store->get());
  options.total_steps = 10;
  auto trainer = Trainer::Create(options, MlpFromSeed(1), train, std::nullopt, &local, &sink);
  ASSERT_TRUE(trainer.ok());
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 10);
  int failed = 0;
  for (const CheckpointNotice& notice : sink.checkpoints()) {
    if (notice.error.empty()) {
      EXPECT_GE(notice.seconds, 0);
      EXPECT_GT(notice.bytes, 0);
      continue;
    }
    EXPECT_EQ(notice.step, 8);
    EXPECT_TRUE(notice.path.empty());
    ++failed;
  }
  EXPECT_EQ(failed, 1);
  EXPECT_EQ((*store)->Steps(), (std::vector<int64_t>{10}));
}

// bf16 autocast: training still converges, and the numbers differ from fp32 (autocast is really on).
TEST(TrainerCheckpointTest, Bf16AutocastTrains) {
  const TensorDataset train = SyntheticSet(256);
  LocalGradientSynchronizer local;
  std::vector<std::vector<double>> runs;
  for (auto precision : {fitrun::v1::PRECISION_FP32, fitrun::v1::PRECISION_BF16}) {
    FakeProgressSink sink;
    TrainerOptions options = Options(nullptr);
    options.precision = precision;
    auto trainer = Trainer::Create(options, MlpFromSeed(1), train, std::nullopt, &local, &sink);
    ASSERT_TRUE(trainer.ok());
    ASSERT_TRUE((*trainer)->Run().ok());
    runs.push_back(Losses(sink));
  }
  EXPECT_LT(runs[1].back(), runs[1].front() * 0.7);
  EXPECT_NE(runs[0][1], runs[1][1]);
  EXPECT_NEAR(runs[0][1], runs[1][1], 0.05);
}

// fp16 needs a CUDA device: every build refuses a trainer for a model on the CPU, and a CPU build of
// the worker refuses fp16 already in ValidateTrainerOptions, before a rank loads anything (a CUDA build,
// worker/CMakeLists.txt's, leaves that to the device the plan gives the rank).
TEST(TrainerCheckpointTest, Fp16OnCpuIsRejected) {
  TrainerOptions options = Options(nullptr);
  options.precision = fitrun::v1::PRECISION_FP16;
  LocalGradientSynchronizer local;
  FakeProgressSink sink;
  absl::Status status = Trainer::Create(options, MlpFromSeed(1), SyntheticSet(256), std::nullopt, &local, &sink).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("spec.precision"), absl::string_view::npos) << status;
#ifndef FITRUN_WITH_CUDA
  status = ValidateTrainerOptions(options, 256);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("spec.precision"), absl::string_view::npos) << status;
#endif
}

}  // namespace
}  // namespace fitrun::worker
