#include "worker/models/losses.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::worker {
namespace {

namespace F = torch::nn::functional;
using ::testing::HasSubstr;

std::unique_ptr<LossFunction> Loss(fitrun::v1::LossKind kind, std::optional<int64_t> ignore_index = std::nullopt) {
  fitrun::v1::LossSpec spec;
  spec.set_kind(kind);
  if (ignore_index) spec.set_ignore_index(*ignore_index);
  absl::StatusOr<std::unique_ptr<LossFunction>> loss = MakeLoss(spec, nullptr);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return *std::move(loss);
}

double Value(const at::Tensor& t) { return t.item<double>(); }

// A fixed batch: 6 samples, 4 classes or values.
struct Batch {
  at::Tensor scores = at::tensor({0.5f, -1.0f, 2.0f, 0.1f, 1.5f, 0.3f, -0.2f, 0.0f, -0.7f, 0.9f, 0.4f, 1.1f,
                                  2.2f, -0.3f, 0.6f, -1.4f, 0.0f, 0.8f, -0.5f, 1.9f, 1.2f, 1.2f, -2.0f, 0.3f})
                          .reshape({6, 4});
  at::Tensor classes = at::tensor({2, 0, 3, 0, 3, 1}, at::kLong);
  at::Tensor values = at::tensor({0.4f, -0.8f, 2.5f, 0.2f, 1.0f, -0.1f});
  at::Tensor outputs = at::tensor({0.5f, -1.0f, 2.0f, 0.1f, 1.5f, 0.3f}).reshape({6, 1});
};

TEST(LossesTest, EachLossIsLibTorchsFunctionalLoss) {
  Batch b;
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_CROSS_ENTROPY)->Compute(b.scores, b.classes)),
                   Value(F::cross_entropy(b.scores, b.classes)));
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_UNSPECIFIED)->Compute(b.scores, b.classes)),
                   Value(F::cross_entropy(b.scores, b.classes)));
  const at::Tensor squeezed = b.outputs.squeeze(1);
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_MSE)->Compute(b.outputs, b.values)),
                   Value(F::mse_loss(squeezed, b.values)));
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_L1)->Compute(squeezed, b.values)), Value(F::l1_loss(squeezed, b.values)));
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_SMOOTH_L1)->Compute(squeezed, b.values)),
                   Value(F::smooth_l1_loss(squeezed, b.values)));
  const at::Tensor probabilities = at::tensor({1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f});
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_BCE_WITH_LOGITS)->Compute(squeezed, probabilities)),
                   Value(F::binary_cross_entropy_with_logits(squeezed, probabilities)));
}

TEST(LossesTest, CrossEntropyIgnoresTheIgnoreIndexAndTakesTheClassesLast) {
  Batch b;
  // A masked-token model: [N=2, L=3, C=4] logits against [2, 3] targets, -100 where nothing is predicted.
  const at::Tensor logits = b.scores.reshape({2, 3, 4});
  const at::Tensor targets = at::tensor({2, -100, 3, -100, 3, 1}, at::kLong).reshape({2, 3});
  const double expected =
      Value(F::cross_entropy(logits.reshape({6, 4}), targets.reshape({6}), F::CrossEntropyFuncOptions().ignore_index(-100)));
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_CROSS_ENTROPY, -100)->Compute(logits, targets)), expected);
  // Another ignore_index.
  const at::Tensor padded = at::tensor({2, 0, 3, 0, 3, 1}, at::kLong);
  EXPECT_DOUBLE_EQ(Value(Loss(fitrun::v1::LOSS_KIND_CROSS_ENTROPY, 0)->Compute(b.scores, padded)),
                   Value(F::cross_entropy(b.scores, padded, F::CrossEntropyFuncOptions().ignore_index(0))));
}

TEST(LossesTest, TestFiguresFollowTheLoss) {
  Batch b;
  auto cross_entropy = Loss(fitrun::v1::LOSS_KIND_CROSS_ENTROPY, -100);
  LossFunction::Totals totals;
  // Two batches, one with an ignored position: the accuracy counts only the others.
  cross_entropy->Add(b.scores.narrow(0, 0, 3), b.classes.narrow(0, 0, 3), totals);
  cross_entropy->Add(b.scores.narrow(0, 3, 3), at::tensor({0, -100, 1}, at::kLong), totals);
  const at::Tensor predicted = b.scores.argmax(1);  // 2, 0, 3, 0, 3, 1 ... compare with the targets
  const Evaluation e = cross_entropy->Result(totals);
  EXPECT_EQ(totals.counted, 5);
  const double correct = Value(predicted.narrow(0, 0, 3).eq(b.classes.narrow(0, 0, 3)).sum()) +
                         (predicted[3].item<int64_t>() == 0) + (predicted[5].item<int64_t>() == 1);
  EXPECT_DOUBLE_EQ(*e.accuracy, correct / 5);
  EXPECT_EQ(e.metrics.count("test_loss"), 1u);

  auto mse = Loss(fitrun::v1::LOSS_KIND_MSE);
  LossFunction::Totals mse_totals;
  mse->Add(b.outputs, b.values, mse_totals);
  const Evaluation m = mse->Result(mse_totals);
  EXPECT_FALSE(m.accuracy.has_value());
  EXPECT_NEAR(m.metrics.at("test_mse"), Value(F::mse_loss(b.outputs.squeeze(1), b.values)), 1e-7);
  EXPECT_NEAR(Loss(fitrun::v1::LOSS_KIND_L1)->Result([&] {
    LossFunction::Totals t;
    Loss(fitrun::v1::LOSS_KIND_L1)->Add(b.outputs, b.values, t);
    return t;
  }()).metrics.at("test_mae"), Value(F::l1_loss(b.outputs.squeeze(1), b.values)), 1e-7);
}

TEST(LossesTest, TheModulesOwnLossIsCalledAndMustBeAScalar) {
  fitrun::v1::LossSpec spec;
  spec.set_kind(fitrun::v1::LOSS_KIND_MODULE);
  EXPECT_THAT(MakeLoss(spec, nullptr).status().message(), HasSubstr("compute_loss"));
  int calls = 0;
  auto loss = MakeLoss(spec, [&](const at::Tensor& output, const at::Tensor& target) {
    ++calls;
    return (output - target).abs().sum();
  });
  ASSERT_TRUE(loss.ok());
  Batch b;
  EXPECT_DOUBLE_EQ(Value((*loss)->Compute(b.values, b.values * 2)), Value(b.values.abs().sum()));
  EXPECT_EQ(calls, 1);
  auto vector_loss = MakeLoss(spec, [](const at::Tensor& output, const at::Tensor&) { return output; });
  EXPECT_THROW((*vector_loss)->Compute(b.values, b.values), c10::Error);
}

TEST(LossesTest, MismatchedShapesAndDtypesSayWhatWasFound) {
  Batch b;
  try {
    Loss(fitrun::v1::LOSS_KIND_MSE)->Compute(b.scores, b.values);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("mse compares an output and a target of one shape; got [6, 4] against [6]"));
  }
  try {
    Loss(fitrun::v1::LOSS_KIND_CROSS_ENTROPY)->Compute(b.scores, b.values);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cross_entropy needs integer classes"));
  }
}

}  // namespace
}  // namespace fitrun::worker
