#include "client/loss_curve.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/format.h"

namespace fitrun::client {

void LossCurve::Add(const v1::JobEvent& event) {
  if (!event.has_progress() || event.progress().rank() != 0) return;
  const v1::Progress& progress = event.progress();
  while (!points_.empty() && points_.back().step >= progress.step()) points_.pop_back();
  points_.push_back({progress.step(), progress.loss()});
}

std::string RenderLossCurve(const std::vector<LossPoint>& points, int width) {
  std::vector<double> losses;
  losses.reserve(points.size());
  const LossPoint* first = nullptr;
  const LossPoint* last = nullptr;
  const LossPoint* lowest = nullptr;
  int not_finite = 0;
  for (const LossPoint& point : points) {
    losses.push_back(point.loss);
    if (!std::isfinite(point.loss)) {
      ++not_finite;
      continue;
    }
    if (first == nullptr) first = &point;
    last = &point;
    if (lowest == nullptr || point.loss < lowest->loss) lowest = &point;
  }
  if (first == nullptr || first == last) return "";
  std::string line = absl::StrCat(FormatLoss(first->loss), " ", Sparkline(losses, width), " ", FormatLoss(last->loss),
                                  "  (steps ", first->step, "-", last->step, "; min ", FormatLoss(lowest->loss),
                                  " at step ", lowest->step);
  if (not_finite > 0) absl::StrAppend(&line, "; ", not_finite, " not finite");
  return line + ")";
}

}  // namespace fitrun::client
