#include "worker/trainer/trainer.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/memory/capped_allocator.h"
#include "worker/testing/trainer_options.h"
#include "worker/torch_compat.h"
#include "worker/trainer/fake_progress_sink.h"

namespace fitrun::worker {
namespace {

// Learnable images: class c brightens rows [2c, 2c+2) on top of Gaussian noise.
TensorDataset SyntheticSet(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  TensorDataset set;
  set.targets = at::arange(n, at::kLong).remainder(10);
  set.inputs = {at::randn({n, 1, 28, 28}) * 0.5};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % 10;
    set.inputs[0][i][0].narrow(0, 2 * c, 2).add_(2.0);
  }
  return set;
}

fitrun::v1::ModelSpec Mlp() {
  fitrun::v1::ModelSpec spec;
  spec.set_builtin("mlp");
  return spec;
}

// 20 steps: one epoch of the 640 training samples.
TrainerOptions BaseOptions() {
  TrainerOptions options = testing::SmallTrainerOptions();
  options.total_steps = 20;
  options.optimizer.set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
  return options;
}

class TrainerTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<Trainer>> Make(TrainerOptions options, bool with_test = true) {
    absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(Mlp(), options.seed);
    if (!model.ok()) return model.status();
    std::optional<TensorDataset> test;
    if (with_test) test = SyntheticSet(200, 2);
    return Trainer::Create(std::move(options), *model, SyntheticSet(640, 1), std::move(test),
                           &synchronizer_, &sink_);
  }

  LocalGradientSynchronizer synchronizer_;
  FakeProgressSink sink_;
};

TEST_F(TrainerTest, LossFallsAndTheTestSetIsLearned) {
  auto trainer = Make(BaseOptions());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  ASSERT_TRUE(result.ok()) << result.status();

  const std::vector<StepProgress> progress = sink_.progress();
  ASSERT_EQ(progress.size(), 20u);
  EXPECT_EQ(progress.front().step, 1);
  EXPECT_EQ(progress.back().step, 20);
  EXPECT_EQ(progress.back().total_steps, 20);
  EXPECT_LT(progress.back().loss, progress.front().loss / 2)
      << "first " << progress.front().loss << " last " << progress.back().loss;
  EXPECT_EQ(result->steps, 20);
  EXPECT_DOUBLE_EQ(result->final_loss, progress.back().loss);
  EXPECT_EQ(result->parameter_checksum.size(), 16u);
  EXPECT_TRUE(result->has_test_accuracy);
  EXPECT_GT(result->test_accuracy, 0.9);
  EXPECT_GT(result->train_seconds, 0);
}

TEST_F(TrainerTest, EpochsAdvanceAfterStepsPerEpoch) {
  TrainerOptions options = BaseOptions();
  options.steps_per_epoch = 0;  // derived: 640 / 32 = 20
  options.total_steps = 45;
  auto trainer = Make(options, /*with_test=*/false);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->has_test_accuracy);
  const std::vector<StepProgress> progress = sink_.progress();
  ASSERT_EQ(progress.size(), 45u);
  EXPECT_EQ(progress[19].epoch, 1);
  EXPECT_EQ(progress[20].epoch, 2);
  EXPECT_EQ(progress[44].epoch, 3);
}

TEST_F(TrainerTest, SameOptionsGiveBitwiseSameWeights) {
  auto first = Make(BaseOptions());
  ASSERT_TRUE(first.ok());
  absl::StatusOr<TrainResult> a = (*first)->Run();
  auto second = Make(BaseOptions());
  ASSERT_TRUE(second.ok());
  absl::StatusOr<TrainResult> b = (*second)->Run();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->parameter_checksum, b->parameter_checksum);
}

TEST_F(TrainerTest, AdamAndAdamWTrain) {
  for (auto kind : {fitrun::v1::OPTIMIZER_KIND_ADAM, fitrun::v1::OPTIMIZER_KIND_ADAMW}) {
    TrainerOptions options = BaseOptions();
    options.optimizer.set_kind(kind);
    options.optimizer.set_weight_decay(0.01);
    options.learning_rate = 1e-3;
    FakeProgressSink sink;
    auto model = CreateModel(Mlp(), 1);
    ASSERT_TRUE(model.ok());
    auto trainer = Trainer::Create(options, *model, SyntheticSet(640, 1), std::nullopt, &synchronizer_, &sink);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
    EXPECT_LT(sink.progress().back().loss, sink.progress().front().loss) << kind;
  }
}

TEST_F(TrainerTest, ThrottleKeepsFirstAndLastStep) {
  TrainerOptions options = BaseOptions();
  options.progress_interval = absl::Hours(1);
  auto trainer = Make(options, /*with_test=*/false);
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Run().ok());
  const std::vector<StepProgress> progress = sink_.progress();
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_EQ(progress[0].step, 1);
  EXPECT_EQ(progress[1].step, 20);
}

TEST(ProgressThrottleTest, AtMostOncePerInterval) {
  ProgressThrottle throttle(absl::Milliseconds(250));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(throttle.ShouldReport(1, 100, t0));
  EXPECT_FALSE(throttle.ShouldReport(2, 100, t0 + absl::Milliseconds(100)));
  EXPECT_TRUE(throttle.ShouldReport(3, 100, t0 + absl::Milliseconds(250)));
  EXPECT_FALSE(throttle.ShouldReport(4, 100, t0 + absl::Milliseconds(300)));
  EXPECT_TRUE(throttle.ShouldReport(100, 100, t0 + absl::Milliseconds(301)));
}

TEST_F(TrainerTest, FaultInjectionExitsRightBeforeItsStep) {
  TrainerOptions options = BaseOptions();
  options.fault_injection.set_kind(fitrun::v1::FaultInjection::KIND_EXIT);
  options.fault_injection.set_rank(0);
  options.fault_injection.set_at_step(5);
  options.fault_injection.set_exit_code(42);
  int exit_code = -1;
  Trainer* self = nullptr;
  options.exit_process = [&](int code) {
    exit_code = code;
    self->RequestStop();  // stands in for the process ending
  };
  auto trainer = Make(options);
  ASSERT_TRUE(trainer.ok());
  self = trainer->get();
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  EXPECT_EQ(exit_code, 42);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sink_.progress().back().step, 4);
  ASSERT_FALSE(sink_.logs().empty());
  EXPECT_TRUE(absl::StrContains(sink_.logs().back(), "before step 5")) << sink_.logs().back();
  EXPECT_GE(sink_.flushes(), 1);
}

TEST_F(TrainerTest, FaultInjectionForAnotherRankDoesNothing) {
  TrainerOptions options = BaseOptions();
  options.fault_injection.set_kind(fitrun::v1::FaultInjection::KIND_EXIT);
  options.fault_injection.set_rank(1);
  options.fault_injection.set_at_step(5);
  options.exit_process = [](int) { ADD_FAILURE() << "rank 0 must not exit"; };
  auto trainer = Make(options, false);
  ASSERT_TRUE(trainer.ok());
  EXPECT_TRUE((*trainer)->Run().ok());
}

TEST_F(TrainerTest, OutOfMemoryFaultIsARealAllocatorRefusalAtItsStep) {
  CappedCpuAllocator memory(/*cap_bytes=*/1LL << 30);
  memory.Install();
  TrainerOptions options = BaseOptions();
  options.fault_injection.set_kind(fitrun::v1::FaultInjection::KIND_OOM);
  options.fault_injection.set_rank(0);
  options.fault_injection.set_at_step(3);
  options.exhaust_memory = [&memory] {  // as fitrun-worker does on a capped device
    (void)torch::empty({memory.cap_bytes() - memory.Live() + (1LL << 20)}, torch::kUInt8);
  };
  auto trainer = Make(options);
  ASSERT_TRUE(trainer.ok());
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  memory.Uninstall();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "step 3: out of device memory")) << result.status();
  EXPECT_GT(memory.LastFailedRequest(), memory.cap_bytes() - memory.LiveAtLastFailure());
  EXPECT_EQ(sink_.progress().back().step, 2);
}

TEST_F(TrainerTest, StopRequestCancelsBeforeTheNextStep) {
  auto trainer = Make(BaseOptions());
  ASSERT_TRUE(trainer.ok());
  (*trainer)->RequestStop();
  EXPECT_EQ((*trainer)->Run().status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(sink_.progress().empty());
}

TEST_F(TrainerTest, DivergingLossIsAnError) {
  TrainerOptions options = BaseOptions();
  options.learning_rate = 1e12;
  auto trainer = Make(options, false);
  ASSERT_TRUE(trainer.ok());
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "loss is")) << result.status();
}

// The fused optimizer kernels (LibTorch 2.x, CPU and CUDA) train as torch::optim's step does, up to
// rounding; a LibTorch without them refuses to be asked for them.
TEST_F(TrainerTest, FusedOptimizersTrainAsTorchOptimDoes) {
  for (auto kind : {fitrun::v1::OPTIMIZER_KIND_SGD, fitrun::v1::OPTIMIZER_KIND_ADAMW}) {
    TrainerOptions options = BaseOptions();
    options.optimizer.set_kind(kind);
    options.optimizer.set_weight_decay(0.01);
    if (kind == fitrun::v1::OPTIMIZER_KIND_ADAMW) options.learning_rate = 1e-3;
    options.fused_optimizer = true;
    auto fused = Make(options, false);
    if (!torch_compat::HasFusedOptimizerKernels()) {
      EXPECT_EQ(fused.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(fused.ok()) << fused.status();
    absl::StatusOr<TrainResult> fused_result = (*fused)->Run();
    options.fused_optimizer = false;
    auto plain = Make(options, false);
    ASSERT_TRUE(plain.ok());
    absl::StatusOr<TrainResult> plain_result = (*plain)->Run();
    ASSERT_TRUE(fused_result.ok() && plain_result.ok());
    EXPECT_NEAR(fused_result->final_loss, plain_result->final_loss, 1e-4 * plain_result->final_loss)
        << fitrun::v1::OptimizerKind_Name(kind);
  }
}

// On a GPU the host reads the losses back only every few steps: a diverging run then stops at the
// next such step, every rank at the same one, and says the same as a run that checked every step.
TEST_F(TrainerTest, DivergingLossChecksEveryFewStepsNameTheSameStep) {
  TrainerOptions options = BaseOptions();
  options.learning_rate = 1e12;
  options.progress_interval = absl::Hours(1);  // no report reads in between, but the first step's
  auto every_step = Make(options, false);
  ASSERT_TRUE(every_step.ok());
  const absl::Status checked_each = (*every_step)->Run().status();
  ASSERT_EQ(checked_each.code(), absl::StatusCode::kInternal);
  const int64_t diverged_at = (*every_step)->current_step();
  ASSERT_LT(diverged_at, 5) << checked_each;

  options.loss_check_interval_steps = 5;
  auto every_five = Make(options, false);
  ASSERT_TRUE(every_five.ok());
  const absl::Status checked_later = (*every_five)->Run().status();
  EXPECT_EQ(checked_later, checked_each);
  EXPECT_TRUE(absl::StrContains(checked_later.message(), absl::StrCat("at step ", diverged_at))) << checked_later;
  EXPECT_EQ((*every_five)->current_step(), 5);

  options.loss_check_interval_steps = -1;
  EXPECT_EQ(Make(options, false).status().code(), absl::StatusCode::kInvalidArgument);
}

// The trainer runs on the device its options name and refuses a model that is not there (the meta
// device stands in for a second device on a CPU-only machine; LibTorch 1.13 cannot move a module to
// it, so the trainer is told the model should be there instead).
TEST_F(TrainerTest, TrainsOnItsDeviceAndRefusesAModelElsewhere) {
  TrainerOptions options = BaseOptions();
  options.device = c10::Device(c10::kCPU);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Make(options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->has_test_accuracy);

  options.device = c10::Device(c10::kMeta);
  absl::StatusOr<std::unique_ptr<Trainer>> refused = Make(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "is on cpu but the trainer's device is meta"))
      << refused.status();
}

TEST_F(TrainerTest, RejectsPlansThatDoNotFitTheData) {
  TrainerOptions options = BaseOptions();
  options.steps_per_epoch = 21;  // 21 * 32 > 640
  absl::Status status = Make(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "plan.steps_per_epoch")) << status;

  options = BaseOptions();
  options.per_device_batch = 0;
  EXPECT_TRUE(absl::StrContains(Make(options).status().message(), "plan.per_device_batch"));
  options = BaseOptions();
  options.learning_rate = 0;
  EXPECT_TRUE(absl::StrContains(Make(options).status().message(), "plan.learning_rate"));
  options = BaseOptions();
  options.total_steps = 0;
  EXPECT_TRUE(absl::StrContains(Make(options).status().message(), "plan.total_steps"));
  options = BaseOptions();
  options.grad_accum_steps = 0;
  EXPECT_TRUE(absl::StrContains(Make(options).status().message(), "plan.grad_accum_steps"));
  options = BaseOptions();
  options.optimizer.set_weight_decay(-1);
  EXPECT_TRUE(absl::StrContains(Make(options).status().message(), "spec.optimizer.weight_decay"));
  options = BaseOptions();
  options.optimizer.set_momentum(-0.5);
  EXPECT_TRUE(absl::StrContains(Make(options).status().message(), "spec.optimizer.momentum"));
  options = BaseOptions();
  options.world_size = 2;
  options.per_device_batch = 400;
  EXPECT_TRUE(absl::StrContains(Make(options).status().message(), "larger than the 640"));
}

}  // namespace
}  // namespace fitrun::worker
