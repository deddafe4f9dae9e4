// What fitrund has measured of one workload's memory (a Calibration: the probe's curve, real runs'
// peaks, the probe's step times) and the ModelProfile the estimator and the planner use from it: the
// analytic profile with the measured curve, corrected by the runs, in place of its memory figures.
// MemoryCalibrator (memory_calibration.h) gathers and keeps calibrations; these are plain functions.
#ifndef FITRUN_SERVER_CORE_CALIBRATION_CALIBRATED_PROFILE_H_
#define FITRUN_SERVER_CORE_CALIBRATION_CALIBRATED_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/memory/memory_curve.h"
#include "server/core/memory/model_profile.h"

namespace fitrun::server {

// Empty when the measured peaks follow the batch; otherwise why a script's batch cannot be planned
// (the same peak, to 0.01%, from micro-batch 1 to at least 8) and the fix.
std::string BatchIgnoredBy(const MemoryCurve& curve);

// Everything fitrund has measured of one workload's memory, and the time its probe's steps took.
struct Calibration {
  int64_t model_state_bytes = 0;
  // Every peak the probe measured: the sweep's, then single measurements at plans' batches.
  MemoryCurve measured;
  // Why the sweep stopped doubling where it did.
  std::string sweep_note;
  // Peaks real runs reported at their per-device batch (an attempt's largest rank peak), newest last.
  std::vector<MeasuredPeak> runs;
  // The sweep's step times, by micro-batch (none where the probe does not time its steps).
  std::vector<MeasuredStepTime> step_times;
  // No sweep: `measured` is the runs' peaks themselves (a script planned from its runs).
  bool from_runs_only = false;

  // The factor real runs show the probe's curve to be off by: the largest run peak / curve ratio
  // (so no run's peak is above the corrected curve), or 1 while every run is within `tolerance`.
  double RunCorrection(double tolerance) const;
};

// What a script's runs alone measured (no probe swept it): each run a point of its curve, at its
// per-device batch (the larger peak where runs share a batch).
Calibration CalibrationFromRuns(const std::vector<MeasuredPeak>& runs);

// The analytic profile with the calibration's curve (corrected by real runs) in place of its memory
// figures, and the plan's account of where they come from in memory_source; with the probe's step
// times.
ModelProfile CalibratedProfile(ModelProfile analytic, const Calibration& calibration, double run_tolerance);

// The profile to plan a model recomputing its blocks' activations with, before its own workload is
// measured: where the model keeping them is, that curve with its per-sample part scaled by the
// analytic ratio of the two models' activations (so the fixed part, measured, is not the analytic
// overheads' guess); `recomputing` as it is otherwise. A tight plan on it has the recomputing model
// measured before it launches (planning_gate.h).
ModelProfile RecomputingProfile(const ModelProfile& kept, ModelProfile recomputing);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_CALIBRATION_CALIBRATED_PROFILE_H_
