// A rank's peak memory as a function of its micro-batch, from peaks measured by running the model
// (fitrun-worker --probe), and the sweep that decides which micro-batches to measure.
//
// What the measurements show (README, "Estimator accuracy"): a step's peak is flat at small batches,
// where a batch-independent cost such as the optimizer step's temporaries sets it (Adam's are several
// times the weights), then grows along lines of increasing slope as activations take over. So the
// curve is convex, and for a convex curve two measured neighbours bound every batch between them:
// the chord from above, and the lines through the adjacent measured segments, extended, from below.
// The sweep doubles the batch until the curve has clearly left its flat start (its slope is steady,
// the per-sample part is most of the peak, and plans cannot go far beyond it) or a limit is reached, then measures more wherever
// the two bounds are further apart than the tolerance. The estimate between points is the chord, so
// it is never below a convex curve and at most the tolerance above it. Beyond the largest measured
// batch the steady slope is extrapolated: not a bound, which is why plans there are confirmed by one
// more measurement (server/core/jobs/job_manager.cc) and say so.
//
// Plain value types and pure functions; no I/O.
#ifndef FITRUN_SERVER_CORE_MEMORY_MEMORY_CURVE_H_
#define FITRUN_SERVER_CORE_MEMORY_MEMORY_CURVE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace fitrun::server {

// One rank's peak bytes at one micro-batch size.
struct MeasuredPeak {
  int64_t batch = 0;
  int64_t peak_bytes = 0;
};

class MemoryCurve {
 public:
  MemoryCurve() = default;
  // Any order; one point per batch (the larger peak). A peak below a smaller batch's is raised to
  // it: memory never shrinks with the batch, and a measurement that says so is noise.
  explicit MemoryCurve(std::vector<MeasuredPeak> points);

  bool empty() const { return points_.empty(); }
  // Sorted by batch, non-decreasing in peak.
  const std::vector<MeasuredPeak>& points() const { return points_; }
  int64_t smallest_batch() const { return points_.empty() ? 0 : points_.front().batch; }
  int64_t largest_batch() const { return points_.empty() ? 0 : points_.back().batch; }
  bool Measured(int64_t batch) const;

  // The peak at `batch`: as measured at a measured batch; on the chord between two; from the largest
  // on at ExtrapolationSlope per sample; the smallest's peak below the smallest.
  int64_t PeakAt(int64_t batch) const;
  // Bytes per sample beyond the largest measured batch: the steeper of the last two segments (the
  // last one on a convex curve; a measurement a little low at the end must not flatten the whole
  // extrapolation, as a bf16 mlp's does); 0 with fewer than two points.
  int64_t SlopeBeyond() const;
  // The slope PeakAt extrapolates with: SlopeBeyond, or with one point (a single run's peak) its
  // whole peak per sample, as if nothing of it were batch-independent: an upper bound on a line
  // through a peak whose fixed part is not negative, where a flat extrapolation would promise any
  // larger batch the same peak.
  int64_t ExtrapolationSlope() const;
  // The batch-independent part, for the plan's breakdown: the first segment's line at batch 0.
  int64_t FixedBytes() const;

  // Every peak times `factor` (for a correction learned from real runs).
  MemoryCurve Scaled(double factor) const;
  // Every peak's batch-dependent part (what it adds over FixedBytes) times `factor`.
  MemoryCurve ScaledPerSample(double factor) const;
  // With one more point (a confirmation).
  MemoryCurve WithPoint(MeasuredPeak point) const;
  // With what an out-of-memory error at `bound.batch` says: the peak there is more than
  // `bound.peak_bytes`. A point at the larger of that and the current estimate, so that a bound below
  // the estimate (a probe capped under the device's memory) never lowers it.
  MemoryCurve WithLowerBound(MeasuredPeak bound) const;

  // "micro-batches 1, 2, 4, ..., 2048 (13.3 MiB to 33.9 MiB)"
  std::string Describe() const;
  // How PeakAt(batch) is obtained: "measured at 512", "between the measured 256 and 512",
  // "extrapolated beyond the largest measured 2048 at 11.1 KiB per sample".
  std::string HowEstimated(int64_t batch) const;

 private:
  std::vector<MeasuredPeak> points_;
};

// How far a calibration sweep measures.
struct SweepLimits {
  // The largest micro-batch worth measuring: the dataset's training samples, or the most a job's
  // rank could take in one micro-batch.
  int64_t max_batch = 1;
  // No measurement predicted to peak above this (the roomiest device; the host's budget for probes).
  // The probe enforces it too, since a prediction from below can be short.
  int64_t max_bytes = int64_t{1} << 30;
  // The smallest micro-batch the probe found to need more than max_bytes (0: none yet): nothing from
  // there up is measured.
  int64_t over_budget_batch = 0;
  // Refine an interval where the upper and lower bounds differ by more than this share.
  double tolerance = 0.04;
  // The flat start is over when the last two segments' slopes agree within this share ...
  double steady_slope = 0.05;
  // ... and the per-sample part (slope x batch) is at least this share of the peak ...
  double per_sample_share = 0.5;
  // ... and the largest micro-batch a plan could take (max_batch, or where the steady slope reaches
  // max_bytes) is at most this many times the largest measured. A slope steady over small batches
  // can still steepen later (SASRec in fp32 with SGD: 272 KiB per sample up to 8, 323 KiB from ~30
  // on), so the sweep measures to within this factor of where plans go instead of extrapolating there.
  double extrapolation_reach = 4.0;
  int max_points = 24;
  // Each point starts the workload afresh (a script: its interpreter, its imports, a GPU's context,
  // about 10 s on a GPU), so the sweep measures the largest micro-batch a plan can take first and,
  // where that fits the budget, only micro-batch 1 and their geometric mean beside it: three runs
  // instead of a doubling's log2(max_batch) + 1. Past the budget, it doubles from 1 as otherwise.
  bool costly_points = false;
};

// The sweep's next step from what it has measured so far: the next micro-batch to measure, or 0
// when it is done, with why it stopped doubling where it did (for the plan's reasons).
struct SweepStep {
  int64_t next_batch = 0;
  std::string done_reason;
};
SweepStep NextSweepBatch(const MemoryCurve& measured, const SweepLimits& limits);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_MEMORY_CURVE_H_
