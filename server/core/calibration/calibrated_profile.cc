#include "server/core/calibration/calibrated_profile.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/units.h"

namespace fitrun::server {

std::string BatchIgnoredBy(const MemoryCurve& curve) {
  if (curve.points().size() < 3 || curve.largest_batch() < 8 * curve.smallest_batch()) return "";
  int64_t lowest = curve.points().front().peak_bytes;
  int64_t highest = lowest;
  for (const MeasuredPeak& p : curve.points()) {
    lowest = std::min(lowest, p.peak_bytes);
    highest = std::max(highest, p.peak_bytes);
  }
  // Anything that follows the batch moves the peak by at least its inputs, if only by a few hundred
  // bytes for a tiny model; a script that ignores it allocates exactly the same tensors every run.
  const int64_t noise = lowest / 10000;
  if (highest - lowest > noise) return "";
  return absl::StrCat("spec.script: the probe measured the same peak (", FormatBytes(highest), ") at micro-batches ",
                      curve.smallest_batch(), " to ", curve.largest_batch(),
                      ": the script's memory does not follow the batch, so it reads neither spec.script.batch_flag "
                      "nor FITRUN_PER_DEVICE_BATCH. Make it take its batch from one of them (and set batch_flag), "
                      "or fix spec.resources.per_device_batch to the batch it uses");
}

Calibration CalibrationFromRuns(const std::vector<MeasuredPeak>& runs) {
  Calibration c;
  c.runs = runs;
  c.measured = MemoryCurve(runs);
  c.from_runs_only = true;
  return c;
}

double Calibration::RunCorrection(double tolerance) const {
  if (measured.empty() || runs.empty() || from_runs_only) return 1.0;
  double largest = 0;
  for (const MeasuredPeak& run : runs) {
    const int64_t expected = measured.PeakAt(run.batch);
    if (expected > 0) largest = std::max(largest, static_cast<double>(run.peak_bytes) / static_cast<double>(expected));
  }
  if (largest <= 0 || std::abs(largest - 1.0) <= tolerance) return 1.0;
  return largest;
}

ModelProfile CalibratedProfile(ModelProfile analytic, const Calibration& calibration, double run_tolerance) {
  ModelProfile p = std::move(analytic);
  if (calibration.model_state_bytes > 0) p.parameter_count = calibration.model_state_bytes / 4;
  const double correction = calibration.RunCorrection(run_tolerance);
  p.measured = correction == 1.0 ? calibration.measured : calibration.measured.Scaled(correction);
  p.step_times = calibration.step_times;
  std::sort(p.step_times.begin(), p.step_times.end(),
            [](const MeasuredStepTime& a, const MeasuredStepTime& b) { return a.batch < b.batch; });
  if (calibration.from_runs_only) {
    p.memory_source = absl::StrCat("measured by its runs: ", calibration.runs.size(),
                                   " run(s) of it peaked as measured at ", calibration.measured.Describe(),
                                   " (the highest rank's peak of each run, at its per-device batch)");
    return p;
  }
  p.memory_source = absl::StrCat("calibrated: fitrun-worker --probe measured the peak at ",
                                 calibration.measured.Describe());
  if (!calibration.sweep_note.empty()) absl::StrAppend(&p.memory_source, "; ", calibration.sweep_note);
  if (correction != 1.0) {
    absl::StrAppend(&p.memory_source,
                    absl::StrFormat("; real runs peaked at up to %.2fx the measurements (%d run(s)), so the "
                                    "curve is scaled by %.2f",
                                    correction, static_cast<int>(calibration.runs.size()), correction));
  } else if (!calibration.runs.empty()) {
    absl::StrAppend(&p.memory_source, "; ", calibration.runs.size(), " real run(s) agree within ",
                    absl::StrFormat("%.0f%%", run_tolerance * 100));
  }
  return p;
}

ModelProfile RecomputingProfile(const ModelProfile& kept, ModelProfile recomputing) {
  if (recomputing.measured.has_value() || !kept.measured.has_value() || kept.activation_bytes_per_sample <= 0) {
    return recomputing;
  }
  const double ratio = static_cast<double>(recomputing.activation_bytes_per_sample) /
                       static_cast<double>(kept.activation_bytes_per_sample);
  recomputing.measured = kept.measured->ScaledPerSample(ratio);
  recomputing.parameter_count = kept.parameter_count;
  recomputing.memory_source = absl::StrFormat(
      "derived: the measured curve of the model keeping its activations, its per-sample part scaled by %.2f (the "
      "analytic ratio of recomputed to kept activations), until the recomputing model is measured",
      ratio);
  return recomputing;
}

}  // namespace fitrun::server
