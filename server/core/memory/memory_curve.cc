#include "server/core/memory/memory_curve.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

// The line through two points, as a function of the batch.
struct Line {
  double at = 0;     // batch of the anchor point
  double peak = 0;   // peak at the anchor
  double slope = 0;  // bytes per sample
  double operator()(double batch) const { return peak + slope * (batch - at); }
};

Line Through(const MeasuredPeak& a, const MeasuredPeak& b) {
  return {static_cast<double>(a.batch), static_cast<double>(a.peak_bytes),
          static_cast<double>(b.peak_bytes - a.peak_bytes) / static_cast<double>(b.batch - a.batch)};
}

// Where two lines meet, if they are not parallel.
std::optional<double> Intersection(const Line& a, const Line& b) {
  if (a.slope == b.slope) return std::nullopt;
  // a.peak + a.slope (x - a.at) = b.peak + b.slope (x - b.at)
  return (b.peak - a.peak + a.slope * a.at - b.slope * b.at) / (a.slope - b.slope);
}

// The largest relative distance between the upper bound (the chord) and the lower bound (the
// neighbouring segments' lines extended, and the left point's peak) inside interval i of `p`, and
// where it is; for a convex curve the true peak lies between the two.
struct Gap {
  double share = 0;
  double batch = 0;
};
Gap LargestGap(const std::vector<MeasuredPeak>& p, size_t i) {
  const MeasuredPeak& lo = p[i];
  const MeasuredPeak& hi = p[i + 1];
  const Line chord = Through(lo, hi);
  std::vector<Line> below = {{static_cast<double>(lo.batch), static_cast<double>(lo.peak_bytes), 0}};
  if (i >= 1) below.push_back(Through(p[i - 1], lo));
  if (i + 2 < p.size()) below.push_back(Through(hi, p[i + 2]));
  auto lower = [&below](double x) {
    double best = below.front()(x);
    for (const Line& l : below) best = std::max(best, l(x));
    return best;
  };
  // The distance is concave between the kinks of the lower bound, so its largest value is at a
  // kink; the midpoint covers an interval whose lower bound has none inside.
  std::vector<double> candidates = {(lo.batch + hi.batch) / 2.0};
  for (size_t a = 0; a < below.size(); ++a) {
    for (size_t b = a + 1; b < below.size(); ++b) {
      if (std::optional<double> x = Intersection(below[a], below[b]); x && *x > lo.batch && *x < hi.batch) {
        candidates.push_back(*x);
      }
    }
  }
  Gap gap;
  for (double x : candidates) {
    const double floor = lower(x);
    if (floor <= 0) continue;
    const double share = (chord(x) - floor) / floor;
    if (share > gap.share) gap = {share, x};
  }
  return gap;
}

}  // namespace

MemoryCurve::MemoryCurve(std::vector<MeasuredPeak> points) {
  std::map<int64_t, int64_t> by_batch;
  for (const MeasuredPeak& p : points) {
    if (p.batch < 1) continue;
    int64_t& peak = by_batch[p.batch];
    peak = std::max(peak, p.peak_bytes);
  }
  int64_t running = 0;
  for (const auto& [batch, peak] : by_batch) {
    running = std::max(running, peak);
    points_.push_back({batch, running});
  }
}

bool MemoryCurve::Measured(int64_t batch) const {
  return std::binary_search(points_.begin(), points_.end(), MeasuredPeak{batch, 0},
                            [](const MeasuredPeak& a, const MeasuredPeak& b) { return a.batch < b.batch; });
}

int64_t MemoryCurve::PeakAt(int64_t batch) const {
  if (points_.empty()) return 0;
  if (batch <= points_.front().batch) return points_.front().peak_bytes;
  if (batch >= points_.back().batch) {
    const double beyond = static_cast<double>(batch - points_.back().batch);
    return points_.back().peak_bytes +
           static_cast<int64_t>(std::ceil(static_cast<double>(ExtrapolationSlope()) * beyond));
  }
  const auto hi = std::lower_bound(points_.begin(), points_.end(), MeasuredPeak{batch, 0},
                                   [](const MeasuredPeak& a, const MeasuredPeak& b) { return a.batch < b.batch; });
  if (hi->batch == batch) return hi->peak_bytes;
  return static_cast<int64_t>(std::ceil(Through(*(hi - 1), *hi)(static_cast<double>(batch))));
}

int64_t MemoryCurve::SlopeBeyond() const {
  const size_t n = points_.size();
  if (n < 2) return 0;
  double slope = Through(points_[n - 2], points_[n - 1]).slope;
  if (n >= 3) slope = std::max(slope, Through(points_[n - 3], points_[n - 2]).slope);
  return std::max<int64_t>(0, static_cast<int64_t>(std::ceil(slope)));
}

int64_t MemoryCurve::ExtrapolationSlope() const {
  if (points_.size() != 1) return SlopeBeyond();
  const MeasuredPeak& only = points_.front();
  return only.batch > 0 ? (only.peak_bytes + only.batch - 1) / only.batch : 0;
}

int64_t MemoryCurve::FixedBytes() const {
  if (points_.empty()) return 0;
  if (points_.size() < 2) return points_.front().peak_bytes;
  return std::max<int64_t>(0, static_cast<int64_t>(Through(points_[0], points_[1])(0)));
}

MemoryCurve MemoryCurve::Scaled(double factor) const {
  std::vector<MeasuredPeak> scaled = points_;
  for (MeasuredPeak& p : scaled) p.peak_bytes = static_cast<int64_t>(std::ceil(p.peak_bytes * factor));
  return MemoryCurve(std::move(scaled));
}

MemoryCurve MemoryCurve::ScaledPerSample(double factor) const {
  const int64_t fixed = FixedBytes();
  std::vector<MeasuredPeak> scaled = points_;
  for (MeasuredPeak& p : scaled) {
    p.peak_bytes = fixed + static_cast<int64_t>(std::ceil(static_cast<double>(p.peak_bytes - fixed) * factor));
  }
  return MemoryCurve(std::move(scaled));
}

MemoryCurve MemoryCurve::WithPoint(MeasuredPeak point) const {
  std::vector<MeasuredPeak> points = points_;
  points.push_back(point);
  return MemoryCurve(std::move(points));
}

MemoryCurve MemoryCurve::WithLowerBound(MeasuredPeak bound) const {
  if (!points_.empty()) bound.peak_bytes = std::max(bound.peak_bytes, PeakAt(bound.batch));
  return WithPoint(bound);
}

std::string MemoryCurve::Describe() const {
  if (points_.empty()) return "no measured micro-batches";
  std::vector<int64_t> batches;
  for (const MeasuredPeak& p : points_) batches.push_back(p.batch);
  std::string listed;
  if (batches.size() <= 6) {
    listed = absl::StrJoin(batches, ", ");
  } else {
    listed = absl::StrCat(batches[0], ", ", batches[1], ", ", batches[2], ", ..., ", batches[batches.size() - 2], ", ",
                          batches.back());
  }
  return absl::StrCat("micro-batch", batches.size() > 1 ? "es " : " ", listed, " (", points_.size(), " point",
                      points_.size() > 1 ? "s, " : ", ", FormatBytes(points_.front().peak_bytes),
                      points_.size() > 1 ? absl::StrCat(" to ", FormatBytes(points_.back().peak_bytes)) : "", ")");
}

std::string MemoryCurve::HowEstimated(int64_t batch) const {
  if (points_.empty()) return "not measured";
  if (Measured(batch)) return absl::StrCat("measured at micro-batch ", batch);
  if (batch < points_.front().batch) {
    return absl::StrCat("taken as the smallest measured micro-batch ", points_.front().batch, "'s");
  }
  if (batch > points_.back().batch) {
    if (points_.size() == 1) {
      return absl::StrCat("extrapolated beyond the only measured micro-batch ", points_.back().batch, " at ",
                          FormatBytes(ExtrapolationSlope()), " per sample (all of its peak taken to grow with the batch)");
    }
    return absl::StrCat("extrapolated beyond the largest measured micro-batch ", points_.back().batch, " at ",
                        FormatBytes(SlopeBeyond()), " per sample");
  }
  const auto hi = std::lower_bound(points_.begin(), points_.end(), MeasuredPeak{batch, 0},
                                   [](const MeasuredPeak& a, const MeasuredPeak& b) { return a.batch < b.batch; });
  return absl::StrCat("between the measured micro-batches ", (hi - 1)->batch, " and ", hi->batch);
}

namespace {

// The micro-batch between two measured points where the bounds on the curve are furthest apart, when
// that gap is more than `tolerance` of the peak there.
std::optional<int64_t> WidestGapBatch(const std::vector<MeasuredPeak>& p, double tolerance) {
  Gap widest;
  for (size_t i = 0; i + 1 < p.size(); ++i) {
    if (p[i + 1].batch - p[i].batch < 2) continue;
    const Gap gap = LargestGap(p, i);
    if (gap.share > widest.share) {
      widest = gap;
      widest.batch = std::clamp(std::round(gap.batch), static_cast<double>(p[i].batch + 1),
                                static_cast<double>(p[i + 1].batch - 1));
    }
  }
  if (widest.share > tolerance) return static_cast<int64_t>(widest.batch);
  return std::nullopt;
}

}  // namespace

SweepStep NextSweepBatch(const MemoryCurve& measured, const SweepLimits& limits) {
  const std::vector<MeasuredPeak>& p = measured.points();
  int64_t max_batch = std::max<int64_t>(1, limits.max_batch);
  if (limits.over_budget_batch > 0) max_batch = std::min(max_batch, limits.over_budget_batch - 1);
  if (max_batch < 1) return {0, absl::StrCat("micro-batch 1 needs more than the probe's budget of ", FormatBytes(limits.max_bytes))};
  if (limits.costly_points && limits.over_budget_batch == 0) {
    if (p.empty()) return {max_batch, ""};
    if (p.back().batch == max_batch) {
      if (!measured.Measured(1)) return {1, ""};
      const int64_t middle = std::llround(std::sqrt(static_cast<double>(max_batch)));
      if (middle > 1 && middle < max_batch && !measured.Measured(middle)) return {middle, ""};
      return {0, absl::StrCat("micro-batch ", max_batch, ", the largest a plan can take, fits the probe's budget, and "
                              "each run of a script starts it afresh, so only ",
                              middle > 1 && middle < max_batch ? absl::StrCat("1, ", middle, " and ") : "1 and ",
                              max_batch, " are measured")};
    }
  }
  if (p.empty()) return {1, ""};

  // Doubling, until the curve has clearly left its flat start or a limit is reached.
  std::string stopped;
  const MeasuredPeak& last = p.back();
  const size_t n = p.size();
  // Where points are costly the sweep began past the budget at the largest batch: it doubles up to it.
  if (limits.over_budget_batch > 0 && !(limits.costly_points && 2 * last.batch < limits.over_budget_batch)) {
    stopped = absl::StrCat("micro-batch ", limits.over_budget_batch, " needed more than the probe's budget of ",
                           FormatBytes(limits.max_bytes));
  }
  bool steady = false;
  if (n >= 3) {
    const double before = Through(p[n - 3], p[n - 2]).slope;
    const double now = Through(p[n - 2], p[n - 1]).slope;
    // The largest micro-batch a plan could take, were the slope to stay as it is.
    int64_t plannable = max_batch;
    if (now > 0 && last.peak_bytes < limits.max_bytes) {
      const double to_budget = static_cast<double>(limits.max_bytes - last.peak_bytes) / now;
      plannable = std::min<int64_t>(plannable, last.batch + static_cast<int64_t>(std::min(to_budget, 1e15)));
    }
    steady = now > 0 && std::abs(now - before) <= limits.steady_slope * now &&
             now * last.batch >= limits.per_sample_share * last.peak_bytes &&
             static_cast<double>(plannable) <= limits.extrapolation_reach * static_cast<double>(last.batch);
    if (steady && stopped.empty()) {
      stopped = absl::StrCat("the peak grows steadily by ", FormatBytes(static_cast<int64_t>(now)),
                             " per sample from micro-batch ", p[n - 3].batch, " on, and no plan takes over ",
                             absl::StrFormat("%g", limits.extrapolation_reach), "x the largest measured (",
                             plannable, " at most)");
    }
  }
  if (stopped.empty() && last.batch >= max_batch) {
    stopped = absl::StrCat("micro-batch ", last.batch, " is the largest worth measuring");
  }
  if (stopped.empty() && last.peak_bytes >= limits.max_bytes) {
    stopped = absl::StrCat("micro-batch ", last.batch, " already peaks at the probe's budget of ",
                           FormatBytes(limits.max_bytes));
  }
  if (stopped.empty() && static_cast<int>(n) >= limits.max_points) {
    stopped = absl::StrCat("the sweep's ", limits.max_points, " points are used up at micro-batch ", last.batch);
  }
  if (stopped.empty()) {
    int64_t next = std::min(2 * last.batch, max_batch);
    const int64_t slope = measured.SlopeBeyond();
    if (slope > 0 && last.peak_bytes + slope * (next - last.batch) > limits.max_bytes) {
      next = last.batch + (limits.max_bytes - last.peak_bytes) / slope;
    }
    if (next > last.batch) return {next, ""};
    stopped = absl::StrCat("a micro-batch above ", last.batch, " would peak above the probe's budget of ",
                           FormatBytes(limits.max_bytes));
  }

  // Refining: one more point where the bounds on the curve are furthest apart.
  if (static_cast<int>(n) < limits.max_points) {
    if (const std::optional<int64_t> batch = WidestGapBatch(p, limits.tolerance); batch.has_value()) return {*batch, ""};
  }
  return {0, stopped};
}

}  // namespace fitrun::server
