// A job's loss over its steps, folded from rank 0's progress events, and the one line `fitrun get`
// draws of it. No I/O: tests feed it JobEvent protos.
#ifndef FITRUN_CLIENT_LOSS_CURVE_H_
#define FITRUN_CLIENT_LOSS_CURVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fitrun/v1/job.pb.h"

namespace fitrun::client {

struct LossPoint {
  int64_t step = 0;
  double loss = 0;
};

// Thread-compatible: owned by the thread that reads the events.
class LossCurve {
 public:
  // Rank 0's progress adds a point (every rank reports the global mean loss, so one speaks for all).
  // A step at or below the last point's means a new attempt resumed from a checkpoint: the points
  // from that step on are dropped first, so the curve is the path that led to the job's state.
  void Add(const v1::JobEvent& event);

  const std::vector<LossPoint>& points() const { return points_; }

 private:
  std::vector<LossPoint> points_;
};

// Columns the sparkline of `fitrun get` is resampled to: readable beside its figures in a
// 100-column terminal.
inline constexpr int kLossCurveColumns = 60;

// "2.3000 █▆▄▃▂▂▁▁ 0.4167  (steps 1-234; min 0.3990 at step 200)": the first and last loss either
// side of the sparkline, then the span of steps and the lowest loss. NaN and infinite losses are
// left out of the line and counted ("; 3 not finite"). Empty with fewer than two finite points,
// which draw no curve.
std::string RenderLossCurve(const std::vector<LossPoint>& points, int width = kLossCurveColumns);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_LOSS_CURVE_H_
