#include "client/loss_curve.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;

v1::JobEvent Progress(int32_t rank, int64_t step, double loss) {
  v1::JobEvent event;
  event.mutable_progress()->set_rank(rank);
  event.mutable_progress()->set_step(step);
  event.mutable_progress()->set_loss(loss);
  return event;
}

std::vector<int64_t> Steps(const LossCurve& curve) {
  std::vector<int64_t> steps;
  for (const LossPoint& point : curve.points()) steps.push_back(point.step);
  return steps;
}

TEST(LossCurveTest, TakesRankZerosProgressOnly) {
  LossCurve curve;
  curve.Add(Progress(0, 1, 2.3));
  curve.Add(Progress(1, 1, 9.9));
  v1::JobEvent log;
  log.mutable_log()->set_text("hello");
  curve.Add(log);
  curve.Add(Progress(0, 5, 1.2));
  EXPECT_THAT(curve.points(), ElementsAre(Field(&LossPoint::loss, 2.3), Field(&LossPoint::loss, 1.2)));
  EXPECT_THAT(Steps(curve), ElementsAre(1, 5));
}

TEST(LossCurveTest, AResumedAttemptReplacesThePointsFromItsCheckpointOn) {
  LossCurve curve;
  for (int64_t step : {10, 20, 30, 40}) curve.Add(Progress(0, step, 1.0 / static_cast<double>(step)));
  // Attempt 2 resumes from the checkpoint at step 25: 30 and 40 were lost with attempt 1.
  curve.Add(Progress(0, 26, 0.5));
  curve.Add(Progress(0, 35, 0.4));
  EXPECT_THAT(Steps(curve), ElementsAre(10, 20, 26, 35));
  // The same step reported twice keeps the later report.
  curve.Add(Progress(0, 35, 0.3));
  EXPECT_THAT(Steps(curve), ElementsAre(10, 20, 26, 35));
  EXPECT_EQ(curve.points().back().loss, 0.3);
}

TEST(RenderLossCurveTest, FirstAndLastBesideTheSparklineThenTheMinimum) {
  EXPECT_EQ(RenderLossCurve({{1, 2.3}, {50, 0.9}, {100, 0.35}, {150, 0.5}}),
            "2.3000 █▃▁▂ 0.5000  (steps 1-150; min 0.3500 at step 100)");
}

TEST(RenderLossCurveTest, NotFiniteLossesAreLeftOutAndCounted) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(RenderLossCurve({{1, nan}, {2, 2.0}, {3, 1.0}, {4, nan}}),
            "2.0000 █▁ 1.0000  (steps 2-3; min 1.0000 at step 3; 2 not finite)");
}

TEST(RenderLossCurveTest, FewerThanTwoFinitePointsDrawNothing) {
  EXPECT_EQ(RenderLossCurve({}), "");
  EXPECT_EQ(RenderLossCurve({{1, 2.3}}), "");
  EXPECT_EQ(RenderLossCurve({{1, 2.3}, {2, std::numeric_limits<double>::infinity()}}), "");
}

TEST(RenderLossCurveTest, ALongRunIsResampledToTheWidth) {
  std::vector<LossPoint> points;
  for (int64_t step = 1; step <= 5000; ++step) points.push_back({step, 3.0 / std::sqrt(static_cast<double>(step))});
  const std::string line = RenderLossCurve(points, 60);
  // 60 block characters of 3 bytes between the two losses.
  const std::string prefix = "3.0000 ";
  ASSERT_EQ(line.substr(0, prefix.size()), prefix);
  EXPECT_EQ(line.substr(prefix.size() + 60 * 3), " 0.0424  (steps 1-5000; min 0.0424 at step 5000)");
}

}  // namespace
}  // namespace fitrun::client
