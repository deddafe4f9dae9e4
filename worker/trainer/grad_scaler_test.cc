// The loss scaler on CPU tensors: unscaling, skipping and backing off on inf/NaN, growing after a run
// of good steps, and two ranks reaching the same verdict from their all-reduced gradients.
#include "worker/trainer/grad_scaler.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/thread_ranks.h"

namespace fitrun::worker {
namespace {

std::unique_ptr<GradScaler> MakeScaler(const GradScaler::Options& options = {}) {
  absl::StatusOr<std::unique_ptr<GradScaler>> scaler = GradScaler::Create(options);
  EXPECT_TRUE(scaler.ok()) << scaler.status();
  return *std::move(scaler);
}

// A leaf parameter whose .grad is `grad`.
at::Tensor WithGrad(const at::Tensor& grad) {
  at::Tensor p = at::zeros_like(grad).requires_grad_(true);
  p.mutable_grad() = grad.clone();
  return p;
}

TEST(GradScalerTest, DefaultsArePyTorchs) {
  std::unique_ptr<GradScaler> scaler = MakeScaler();
  EXPECT_EQ(scaler->scale(), 65536.0);
  EXPECT_EQ(scaler->growth_tracker(), 0);
}

TEST(GradScalerTest, CreateRefusesNonsense) {
  for (auto bad : {GradScaler::Options{0.0, 2.0, 0.5, 2000}, GradScaler::Options{65536.0, 1.0, 0.5, 2000},
                   GradScaler::Options{65536.0, 2.0, 1.0, 2000}, GradScaler::Options{65536.0, 2.0, 0.5, 0}}) {
    EXPECT_FALSE(GradScaler::Create(bad).ok());
  }
}

TEST(GradScalerTest, ScaleMultipliesTheLoss) {
  std::unique_ptr<GradScaler> scaler = MakeScaler();
  EXPECT_EQ(scaler->Scale(at::full({}, 0.75)).item<double>(), 0.75 * 65536.0);
}

TEST(GradScalerTest, UnscaleDividesEveryGradientByTheScale) {
  std::unique_ptr<GradScaler> scaler = MakeScaler();
  at::manual_seed(1);
  const at::Tensor g1 = at::randn({5, 3});
  const at::Tensor g2 = at::randn({7});
  std::vector<at::Tensor> parameters = {WithGrad(g1 * 65536.0), WithGrad(g2 * 65536.0),
                                        at::zeros({2}).requires_grad_(true)};  // no gradient: left alone
  EXPECT_TRUE(scaler->Unscale(parameters));
  // The scale is a power of two, so scaling and unscaling are exact.
  EXPECT_TRUE(at::equal(parameters[0].grad(), g1));
  EXPECT_TRUE(at::equal(parameters[1].grad(), g2));
  EXPECT_FALSE(parameters[2].grad().defined());
}

TEST(GradScalerTest, InfOrNanGradientSkipsTheStepAndHalvesTheScale) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::unique_ptr<GradScaler> scaler = MakeScaler();
    scaler->Update(false);  // one good step, so the back-off also resets the tracker
    at::Tensor poisoned = at::ones({4});
    poisoned[2].fill_(bad);
    std::vector<at::Tensor> parameters = {WithGrad(at::ones({3})), WithGrad(poisoned)};
    int steps = 0;
    EXPECT_FALSE(scaler->UnscaleStepAndUpdate(parameters, [&] { ++steps; })) << bad;
    EXPECT_EQ(steps, 0) << bad;
    EXPECT_EQ(scaler->scale(), 32768.0) << bad;
    EXPECT_EQ(scaler->growth_tracker(), 0) << bad;
    EXPECT_EQ(scaler->skipped_steps(), 1) << bad;

    // The next clean step is taken at the halved scale.
    std::vector<at::Tensor> clean = {WithGrad(at::full({3}, 32768.0))};
    EXPECT_TRUE(scaler->UnscaleStepAndUpdate(clean, [&] { ++steps; }));
    EXPECT_EQ(steps, 1);
    EXPECT_TRUE(at::equal(clean[0].grad(), at::ones({3})));
  }
}

TEST(GradScalerTest, GrowsAfterGrowthIntervalGoodStepsInARow) {
  std::unique_ptr<GradScaler> scaler = MakeScaler();
  for (int i = 0; i < 1999; ++i) scaler->Update(false);
  EXPECT_EQ(scaler->scale(), 65536.0);
  EXPECT_EQ(scaler->growth_tracker(), 1999);
  scaler->Update(false);
  EXPECT_EQ(scaler->scale(), 131072.0);
  EXPECT_EQ(scaler->growth_tracker(), 0);

  // An overflow in the middle of a run starts the count again.
  for (int i = 0; i < 1500; ++i) scaler->Update(false);
  scaler->Update(true);
  EXPECT_EQ(scaler->scale(), 65536.0);
  for (int i = 0; i < 1999; ++i) scaler->Update(false);
  EXPECT_EQ(scaler->scale(), 65536.0);
  scaler->Update(false);
  EXPECT_EQ(scaler->scale(), 131072.0);
}

TEST(GradScalerTest, NeverGrowsPastFloat32) {
  std::unique_ptr<GradScaler> scaler = MakeScaler({std::ldexp(1.0, 127), 2.0, 0.5, 1});
  scaler->Update(false);
  EXPECT_EQ(scaler->scale(), std::ldexp(1.0, 127));
}

// Only rank 1 overflows; after the reducer's all-reduce both ranks hold the same non-finite mean, so
// both skip that step, and both take the next, clean one: the verdict needs no collective of its own.
TEST(GradScalerTest, RanksAgreeOnOverflowThroughTheGradientAllReduce) {
  RunRanksAsThreads(2, "scaler_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::Tensor w = at::ones({3, 4}).requires_grad_(true);
    at::Tensor bias = at::zeros({3}).requires_grad_(true);
    BucketedReducer::Options buckets;
    buckets.first_bucket_cap_bytes = 12;  // bias and w in separate buckets
    auto reducer = BucketedReducer::Create(group, {w, bias}, buckets);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    std::unique_ptr<GradScaler> scaler = MakeScaler();

    std::vector<bool> taken;
    for (int step = 0; step < 2; ++step) {
      at::Tensor x = at::full({2, 4}, 1.0 + rank);
      if (step == 0 && rank == 1) x[1][3].fill_(std::numeric_limits<float>::infinity());
      if (w.grad().defined()) w.mutable_grad().zero_();
      if (bias.grad().defined()) bias.mutable_grad().zero_();
      (*reducer)->BeforeBackward(true);
      scaler->Scale((at::matmul(x, w.t()) + bias).sum()).backward();
      ASSERT_TRUE((*reducer)->Synchronize(0).ok());
      taken.push_back(scaler->UnscaleStepAndUpdate({w, bias}, [] {}));
    }
    EXPECT_EQ(taken, (std::vector<bool>{false, true})) << "rank " << rank;
    EXPECT_EQ(scaler->scale(), 32768.0) << "rank " << rank;
    // The clean step's unscaled gradient is the mean of the ranks' (x summed over its rows: 2 and 4).
    EXPECT_TRUE(at::allclose(w.grad(), at::full({3, 4}, 3.0))) << "rank " << rank;
  });
}

}  // namespace
}  // namespace fitrun::worker
