#include "worker/trainer/loss_readback.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace fitrun::worker {
namespace {

TEST(LossReadbackTest, ReadsThePendingLossesAsTheHostWouldHaveReadThemEachStep) {
  LossReadback losses;
  EXPECT_FALSE(losses.pending());
  losses.ReadAll();  // nothing pending: nothing changes
  EXPECT_EQ(losses.last_step(), 0);

  // float32 (the reducer's bucket element) and float64 (a single process's own sum) alike.
  const float third = 1.0f / 3.0f;
  losses.Add(1, at::scalar_tensor(third, at::kFloat));
  losses.Add(2, at::scalar_tensor(0.25, at::kDouble));
  losses.Add(3, at::full({1}, 0.125f, at::kFloat));
  EXPECT_TRUE(losses.pending());
  EXPECT_EQ(losses.last_step(), 0) << "nothing is read before ReadAll";
  losses.ReadAll();
  EXPECT_FALSE(losses.pending());
  EXPECT_EQ(losses.last_step(), 3);
  EXPECT_EQ(losses.last_loss(), 0.125);
  EXPECT_FALSE(losses.first_non_finite().has_value());

  losses.Add(4, at::scalar_tensor(third, at::kFloat));
  losses.ReadAll();
  EXPECT_EQ(losses.last_step(), 4);
  // Bit for bit what item<double>() of the float32 loss gives.
  EXPECT_EQ(losses.last_loss(), static_cast<double>(third));
}

TEST(LossReadbackTest, RemembersTheFirstLossThatWasNotFinite) {
  LossReadback losses;
  losses.Add(7, at::scalar_tensor(2.0, at::kFloat));
  losses.Add(8, at::scalar_tensor(std::numeric_limits<float>::infinity(), at::kFloat));
  losses.Add(9, at::scalar_tensor(std::nan(""), at::kFloat));
  losses.ReadAll();
  ASSERT_TRUE(losses.first_non_finite().has_value());
  EXPECT_EQ(losses.first_non_finite()->step, 8);
  EXPECT_TRUE(std::isinf(losses.first_non_finite()->loss));
  EXPECT_EQ(losses.last_step(), 9);

  losses.Add(10, at::scalar_tensor(std::nan(""), at::kFloat));
  losses.ReadAll();
  EXPECT_EQ(losses.first_non_finite()->step, 8) << "the earliest stays";
}

TEST(LossReadbackTest, ChecksFallOnStepsEveryRankAgreesOn) {
  // Every step when the interval is 1 (the CPU).
  for (int64_t step = 1; step <= 10; ++step) EXPECT_TRUE(LossCheckDue(step, 10, 1, 0));
  // Every 50th step, the last, and those a checkpoint follows.
  EXPECT_FALSE(LossCheckDue(1, 120, 50, 0));
  EXPECT_FALSE(LossCheckDue(49, 120, 50, 0));
  EXPECT_TRUE(LossCheckDue(50, 120, 50, 0));
  EXPECT_TRUE(LossCheckDue(100, 120, 50, 0));
  EXPECT_TRUE(LossCheckDue(120, 120, 50, 0));
  EXPECT_FALSE(LossCheckDue(30, 120, 50, 0));
  EXPECT_TRUE(LossCheckDue(30, 120, 50, 15));
  EXPECT_FALSE(LossCheckDue(31, 120, 50, 15));
}

}  // namespace
}  // namespace fitrun::worker
