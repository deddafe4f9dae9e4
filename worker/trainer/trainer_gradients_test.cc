// The trainer keeps the gradient tensors from step to step: the bucketed reducer's gradients are
// views into its buckets, and a zero_grad that set them to None (LibTorch 2.x's default) would free
// them and have backward allocate them anew each step.
#include <ATen/ATen.h>

#include <vector>

#include "gtest/gtest.h"
#include "worker/ddp/gradient_synchronizer.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {
namespace {

// Records, before each step's first backward (right after the trainer zeroed the gradients), where
// every parameter's gradient lives; nullptr for one that is None.
class GradientRecorder final : public GradientSynchronizer {
 public:
  explicit GradientRecorder(std::vector<at::Tensor> parameters) : parameters_(std::move(parameters)) {}

  void BeforeBackward(bool last_micro_batch) override {
    if (!first_micro_batch_) {
      first_micro_batch_ = last_micro_batch;
      return;
    }
    std::vector<const void*> pointers;
    bool zero = true;
    for (const at::Tensor& p : parameters_) {
      pointers.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
      if (p.grad().defined()) zero = zero && p.grad().eq(0).all().item<bool>();
    }
    before_backward_.push_back(pointers);
    zeroed_.push_back(zero);
    first_micro_batch_ = last_micro_batch;
  }
  absl::StatusOr<at::Tensor> SynchronizeWithLoss(const at::Tensor& local_loss) override { return local_loss; }

  const std::vector<std::vector<const void*>>& before_backward() const { return before_backward_; }
  const std::vector<bool>& zeroed() const { return zeroed_; }

 private:
  const std::vector<at::Tensor> parameters_;
  bool first_micro_batch_ = true;
  std::vector<std::vector<const void*>> before_backward_;
  std::vector<bool> zeroed_;
};

TensorDataset NoiseSet(int64_t n) {
  at::manual_seed(5);
  TensorDataset set;
  set.targets = at::arange(n, at::kLong).remainder(10);
  set.inputs = {at::randn({n, 1, 28, 28})};
  return set;
}

TEST(TrainerGradientsTest, ZeroGradKeepsEveryGradientTensorAcrossSteps) {
  fitrun::v1::ModelSpec spec;
  spec.set_builtin("mlp");
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(spec, /*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  // The reducer's way: every gradient exists, a view it owns, before the first step.
  std::vector<at::Tensor> parameters = (*model)->parameters();
  for (at::Tensor& p : parameters) p.mutable_grad() = at::zeros_like(p);
  GradientRecorder recorder(parameters);
  FakeProgressSink sink;
  TrainerOptions options;
  options.per_device_batch = 8;
  options.grad_accum_steps = 2;
  options.learning_rate = 0.01;
  options.total_steps = 4;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(options, *model, NoiseSet(64), std::nullopt, &recorder, &sink);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<const void*> before_training;
  for (const at::Tensor& p : parameters) before_training.push_back(p.grad().data_ptr());
  ASSERT_TRUE((*trainer)->Run().ok());

  ASSERT_EQ(recorder.before_backward().size(), 4u);
  for (size_t step = 0; step < recorder.before_backward().size(); ++step) {
    EXPECT_EQ(recorder.before_backward()[step], before_training) << "step " << step + 1;
    EXPECT_TRUE(recorder.zeroed()[step]) << "step " << step + 1 << " started from gradients that were not zero";
  }
}

}  // namespace
}  // namespace fitrun::worker
