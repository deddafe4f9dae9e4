#include "server/core/memory/memory_curve.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

// A rank's true peak at a micro-batch, as a test plays the model.
using PeakFunction = std::function<int64_t(int64_t)>;

// Runs the sweep to its end against `truth`, as the calibrator does against a probe (which refuses a
// batch whose peak passes the budget).
MemoryCurve Sweep(const PeakFunction& truth, SweepLimits limits, std::string* done_reason = nullptr,
                  std::vector<int64_t>* order = nullptr) {
  MemoryCurve curve;
  for (int i = 0; i < 100; ++i) {
    const SweepStep step = NextSweepBatch(curve, limits);
    if (step.next_batch == 0) {
      if (done_reason != nullptr) *done_reason = step.done_reason;
      return curve;
    }
    EXPECT_FALSE(curve.Measured(step.next_batch)) << "measured " << step.next_batch << " twice";
    if (order != nullptr) order->push_back(step.next_batch);
    if (truth(step.next_batch) > limits.max_bytes) {
      limits.over_budget_batch = step.next_batch;
      continue;
    }
    curve = curve.WithPoint({step.next_batch, truth(step.next_batch)});
  }
  ADD_FAILURE() << "the sweep did not end";
  return curve;
}

// Adam on the mlp, as fitrun-worker --probe measured it: the optimizer step's temporaries set a flat
// 13.9 MB up to micro-batch ~140; then backward's peak takes over with a slope that grows from 5192 to
// 11336 bytes per sample by 1024 (convex: a kernel's scratch grows with the batch).
int64_t AdamMlp(int64_t b) {
  const int64_t backward = [b] {
    if (b <= 128) return 12322992 + 5192 * b;
    if (b <= 256) return 12987568 + 9032 * (b - 128);
    if (b <= 512) return 14143664 + 9288 * (b - 256);
    if (b <= 1024) return 16521392 + 11332 * (b - 512);
    return 22323376 + 11336 * (b - 1024);
  }();
  return std::max<int64_t>(13926576, backward);
}

// A flat start that a line through two small batches would take for the whole curve: flat 20 MB up
// to ~3000, then 10 KB per sample.
int64_t LateKink(int64_t b) { return std::max<int64_t>(20'000'000, 10'000 * b - 10'000'000); }

int64_t Linear(int64_t b) { return 5'000'000 + 40'000 * b; }

// SASRec in fp32 with SGD, shaped as fitrun-worker --probe measured it: a line of 272 KiB per sample
// that looks steady from 1 to 8 and is most of the peak there, then, from ~30 on, a steeper one of
// 323 KiB per sample (another moment of the step holds the peak).
int64_t SteeperLater(int64_t b) {
  return std::max<int64_t>(1'000'000 + 278'528 * b, 330'752 * b - 500'000);
}

struct Accuracy {
  double worst_under = 0;  // largest (truth - estimate) / truth
  double worst_over = 0;   // largest (estimate - truth) / truth
};
Accuracy Check(const MemoryCurve& curve, const PeakFunction& truth, int64_t up_to) {
  Accuracy a;
  for (int64_t b = 1; b <= up_to; b += std::max<int64_t>(1, b / 64)) {
    const double t = static_cast<double>(truth(b));
    const double e = static_cast<double>(curve.PeakAt(b));
    a.worst_under = std::max(a.worst_under, (t - e) / t);
    a.worst_over = std::max(a.worst_over, (e - t) / t);
  }
  return a;
}

TEST(MemoryCurveTest, InterpolatesOnChordsAndExtrapolatesTheLastSlope) {
  const MemoryCurve curve({{4, 100}, {1, 100}, {8, 200}, {16, 400}});
  EXPECT_EQ(curve.points().front().batch, 1);
  EXPECT_EQ(curve.PeakAt(8), 200);
  EXPECT_EQ(curve.PeakAt(6), 150);
  EXPECT_EQ(curve.PeakAt(1), 100);
  EXPECT_EQ(curve.SlopeBeyond(), 25);
  EXPECT_EQ(curve.PeakAt(20), 500);
  EXPECT_EQ(curve.FixedBytes(), 100);
  EXPECT_TRUE(curve.Measured(16));
  EXPECT_FALSE(curve.Measured(15));
  EXPECT_THAT(curve.HowEstimated(20), HasSubstr("extrapolated beyond the largest measured micro-batch 16"));
  EXPECT_THAT(curve.HowEstimated(6), HasSubstr("between the measured micro-batches 4 and 8"));
  EXPECT_THAT(curve.HowEstimated(8), HasSubstr("measured at micro-batch 8"));
}

TEST(MemoryCurveTest, ALastPointALittleLowDoesNotFlattenTheExtrapolation) {
  // A bf16 mlp with Adam as measured: 8808 bytes per sample, but 2048 came out low.
  const MemoryCurve curve({{512, 16094256}, {1024, 20604080}, {2048, 29278384}});
  EXPECT_EQ(curve.SlopeBeyond(), 8809);  // 8808.25, rounded up
  EXPECT_GE(curve.PeakAt(19700), 184757200);  // measured there
}

TEST(MemoryCurveTest, OnePointBoundsSmallerBatchesByItsPeakAndLargerOnesAsIfItAllGrewWithTheBatch) {
  // One run of a script at per-device batch 8 peaked at 800 MB (say 400 MB fixed, 50 MB a sample).
  const MemoryCurve run({{8, 800'000'000}});
  EXPECT_EQ(run.SlopeBeyond(), 0) << "no segment to extrapolate";
  EXPECT_EQ(run.ExtrapolationSlope(), 100'000'000);
  EXPECT_EQ(run.PeakAt(4), 800'000'000) << "memory never shrinks below what a larger batch peaked at";
  EXPECT_EQ(run.PeakAt(16), 1'600'000'000) << "above 16's 1.2 GB: an upper bound, not a flat 800 MB";
  EXPECT_THAT(run.HowEstimated(16), HasSubstr("beyond the only measured micro-batch 8"));
  EXPECT_EQ(MemoryCurve({{3, 10}}).PeakAt(6), 10 + 3 * 4) << "the slope rounds up";
}

TEST(MemoryCurveTest, AnOutOfMemoryBoundRaisesAnEstimateBelowItAndNeverLowersOne) {
  // The sweep's curve: 100 MB fixed and 1 MB per sample, measured to micro-batch 8.
  const MemoryCurve curve({{2, 102'000'000}, {4, 104'000'000}, {8, 108'000'000}});
  ASSERT_EQ(curve.PeakAt(16), 116'000'000);
  // A probe capped at 110 MB ran out at 16: more than 110 MB, and the extrapolation's 116 MB stands
  // (this case's plan took the bound as the peak and ran 0.9% above it).
  const MemoryCurve capped_low = curve.WithLowerBound({16, 110'000'001});
  EXPECT_EQ(capped_low.PeakAt(16), 116'000'000);
  EXPECT_TRUE(capped_low.Measured(16));
  // A probe that ran out at 16 with 130 MB: the peak there is more than the extrapolation said.
  const MemoryCurve capped_high = curve.WithLowerBound({16, 130'000'001});
  EXPECT_EQ(capped_high.PeakAt(16), 130'000'001);
  EXPECT_EQ(MemoryCurve().WithLowerBound({4, 5}).PeakAt(4), 5) << "an empty curve takes the bound";
}

TEST(MemoryCurveTest, AMeasurementBelowASmallerBatchsIsRaisedToIt) {
  const MemoryCurve curve({{1, 500}, {2, 400}, {4, 800}, {4, 700}});
  EXPECT_EQ(curve.PeakAt(2), 500);
  EXPECT_EQ(curve.PeakAt(4), 800);
}

TEST(MemoryCurveTest, AFlatStartDoesNotFoolTheSweep) {
  SweepLimits limits;
  limits.max_batch = 60000;
  limits.max_bytes = int64_t{2} << 30;
  std::string why;
  const MemoryCurve curve = Sweep(LateKink, limits, &why);
  // It measured well past the kink, and every batch up to the largest measured is within the
  // tolerance above the truth and never below it.
  EXPECT_GT(curve.largest_batch(), 6000);
  EXPECT_THAT(why, HasSubstr("grows steadily"));
  const Accuracy a = Check(curve, LateKink, curve.largest_batch());
  EXPECT_LE(a.worst_under, 0.0);
  EXPECT_LE(a.worst_over, limits.tolerance + 1e-9);
  // Beyond, the steady slope carries on.
  EXPECT_EQ(curve.PeakAt(40000), LateKink(40000));
}

TEST(MemoryCurveTest, AdamsOptimizerPlateauThenAConvexRise) {
  SweepLimits limits;
  limits.max_batch = 60000;
  limits.max_bytes = int64_t{2} << 30;
  const MemoryCurve curve = Sweep(AdamMlp, limits);
  const Accuracy a = Check(curve, AdamMlp, 60000);
  EXPECT_LE(a.worst_under, 0.0) << curve.Describe();
  EXPECT_LE(a.worst_over, limits.tolerance + 1e-9) << curve.Describe();
  EXPECT_LE(static_cast<int>(curve.points().size()), limits.max_points);
}

TEST(MemoryCurveTest, ALinearCurveNeedsFewPoints) {
  SweepLimits limits;
  limits.max_batch = 4096;
  limits.max_bytes = int64_t{1} << 40;
  std::vector<int64_t> order;
  const MemoryCurve curve = Sweep(Linear, limits, nullptr, &order);
  // 5 MB fixed, 40 KB per sample: steady from the start, and measured up to a quarter of the
  // largest batch a plan can take.
  EXPECT_EQ(curve.largest_batch(), 1024);
  EXPECT_LE(order.size(), 12u);
  const Accuracy a = Check(curve, Linear, 4096);
  EXPECT_LE(a.worst_under, 1e-9);
  EXPECT_LE(a.worst_over, 1e-9);
}

TEST(MemoryCurveTest, ASlopeSteadyOverSmallBatchesIsNotExtrapolatedFar) {
  SweepLimits limits;
  limits.max_batch = 2000;
  limits.max_bytes = int64_t{2} << 30;
  std::string why;
  const MemoryCurve curve = Sweep(SteeperLater, limits, &why);
  // Steady at 1, 2, 4, 8 and over half the peak, but a plan may take 2000: it measures on to a
  // quarter of that, past the second line's start, so no batch a plan can take is under-estimated.
  EXPECT_GE(curve.largest_batch() * 4, 2000) << curve.Describe();
  EXPECT_THAT(why, HasSubstr("grows steadily"));
  EXPECT_THAT(why, HasSubstr("2000 at most"));
  const Accuracy a = Check(curve, SteeperLater, 2000);
  EXPECT_LE(a.worst_under, 0.0) << curve.Describe();
  EXPECT_LE(a.worst_over, limits.tolerance + 1e-9) << curve.Describe();
}

TEST(MemoryCurveTest, StopsDoublingWhereTheByteBudgetBoundsThePlans) {
  SweepLimits limits;
  limits.max_batch = 1'000'000;
  limits.max_bytes = 100'000'000;  // ~2,500 samples of Linear
  std::vector<int64_t> order;
  std::string why;
  const MemoryCurve curve = Sweep(Linear, limits, &why, &order);
  EXPECT_THAT(why, HasSubstr("grows steadily"));
  EXPECT_GE(curve.largest_batch() * 4, (limits.max_bytes - 5'000'000) / 40'000);
  EXPECT_LT(curve.largest_batch(), 2048);
}

TEST(MemoryCurveTest, StopsAtTheLargestBatchWorthMeasuring) {
  SweepLimits limits;
  limits.max_batch = 100;  // the job's rank never takes more
  limits.max_bytes = int64_t{1} << 40;
  std::string why;
  const MemoryCurve curve = Sweep(LateKink, limits, &why);
  EXPECT_EQ(curve.largest_batch(), 100);
  EXPECT_THAT(why, HasSubstr("largest worth measuring"));
}

TEST(MemoryCurveTest, StopsBeforeTheProbesByteBudget) {
  SweepLimits limits;
  limits.max_batch = 60000;
  limits.max_bytes = 50'000'000;
  std::string why;
  const MemoryCurve curve = Sweep(LateKink, limits, &why);
  EXPECT_LE(curve.points().back().peak_bytes, limits.max_bytes);
  EXPECT_GT(curve.largest_batch(), 4000);
  EXPECT_THAT(why, HasSubstr("budget"));
}

TEST(MemoryCurveTest, WherePointsAreCostlyTheLargestBatchIsMeasuredFirstAndTwoMoreWhereItFits) {
  SweepLimits limits;
  limits.costly_points = true;
  limits.max_batch = 128;
  limits.max_bytes = int64_t{1} << 40;
  std::vector<int64_t> order;
  std::string why;
  const MemoryCurve curve = Sweep(Linear, limits, &why, &order);
  EXPECT_THAT(order, ::testing::ElementsAre(128, 1, 11));
  EXPECT_EQ(curve.PeakAt(64), Linear(64)) << "a line between measured points";
  EXPECT_THAT(why, HasSubstr("so only 1, 11 and 128 are measured"));

  // Batches too few for a point between: the largest and 1.
  limits.max_batch = 2;
  order.clear();
  Sweep(Linear, limits, &why, &order);
  EXPECT_THAT(order, ::testing::ElementsAre(2, 1));
  EXPECT_THAT(why, HasSubstr("so only 1 and 2 are measured"));
}

TEST(MemoryCurveTest, WherePointsAreCostlyAndTheLargestDoesNotFitTheSweepDoublesFromOne) {
  SweepLimits limits;
  limits.costly_points = true;
  limits.max_batch = 100;
  limits.max_bytes = Linear(40);  // 100 does not fit; up to 40 does
  std::vector<int64_t> order;
  std::string why;
  const MemoryCurve curve = Sweep(Linear, limits, &why, &order);
  ASSERT_GE(order.size(), 3u);
  EXPECT_EQ(order[0], 100) << "the largest first";
  EXPECT_EQ(order[1], 1) << "then doubling from 1, as a sweep whose points cost little";
  EXPECT_EQ(order[2], 2);
  EXPECT_LE(curve.points().back().peak_bytes, limits.max_bytes);
  EXPECT_GE(curve.largest_batch(), 32);
}

TEST(MemoryCurveTest, ScaledAndDescribed) {
  const MemoryCurve curve = MemoryCurve({{1, 1 << 20}, {2, 2 << 20}}).Scaled(1.5);
  EXPECT_EQ(curve.PeakAt(2), 3 << 20);
  EXPECT_EQ(curve.Describe(), "micro-batches 1, 2 (2 points, 1.5 MiB to 3.0 MiB)");
}

}  // namespace
}  // namespace fitrun::server
