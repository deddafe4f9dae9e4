// What a script's first steps measured, and what that means for the plan it runs.
//
// A script is planned from its runs (calibration/planning_gate.h): its first run starts on no
// estimate at all, later ones on the peaks earlier runs reached. Either way a running attempt
// measures its own batch: once every rank has reported its first kFirstSteps optimizer steps (or
// finished), the highest rank's peak at the attempt's per-device batch is a measurement the job
// manager records at once (the plans after it stand on it, even while this one runs), rather than
// only when the attempt ends. The plan is then asked again with it: where it now takes a larger
// per-device batch on the same devices (fewer accumulation passes), the attempt moves there at its
// next checkpoint, once per job; a smaller one is never forced on a batch that ran (an
// out-of-memory error is what re-plans a batch that does not fit).
//
// Plain functions of the attempt's state; the job manager calls them under its lock.
#ifndef FITRUN_SERVER_CORE_JOBS_FIRST_STEPS_H_
#define FITRUN_SERVER_CORE_JOBS_FIRST_STEPS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "fitrun/v1/job.pb.h"
#include "server/core/jobs/job_entry.h"

namespace fitrun::server {

// Optimizer steps after which a rank has allocated what its steps keep (the optimizer's states
// appear in the first, a step holding them and its activations at once comes second).
inline constexpr int64_t kFirstSteps = 2;

// What an attempt's first steps measured: its ranks' highest peak at its per-device batch.
struct FirstStepsPeak {
  int64_t per_device_batch = 0;
  int64_t peak_bytes = 0;
};

// The measurement, once every rank of the attempt reported kFirstSteps steps (or fewer when the
// plan has fewer) or finished, with a peak; nullopt before, and for an attempt that ran out of
// memory or whose ranks report no steps (an unchanged torchrun script: its peak is taken at its end).
std::optional<FirstStepsPeak> MeasuredInFirstSteps(const ActiveAttempt& attempt, const fitrun::v1::Plan& plan);

// The measurement when `entry`'s running script attempt has just completed it and nothing took it
// yet; nullopt otherwise (a built-in job, an attempt already measured, one still in its first steps).
std::optional<FirstStepsPeak> FirstStepsDue(const JobEntry& entry);

// Whether `replanned` (the plan asked again after the measurement) is worth a restart of an
// attempt running `running`: the same devices and strategy, a larger per-device batch.
bool WorthMovingTo(const fitrun::v1::Plan& running, const fitrun::v1::Plan& replanned);

// The line a job's watchers see about the measurement, and about the move when there is one.
std::string DescribeFirstSteps(int attempt, const FirstStepsPeak& measured, const fitrun::v1::Plan& running,
                               const fitrun::v1::Plan* move_to);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_FIRST_STEPS_H_
