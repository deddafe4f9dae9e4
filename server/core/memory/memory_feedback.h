// What a job's out-of-memory errors teach the next plan.
//
// An OOM at per-device batch b proves two things: batch b does not fit that device, and the rank
// needed at least live + requested bytes there (what it held when the allocator refused, plus the
// refused request). The re-plan therefore never tries b or more again, and the estimator's per-sample
// cost is raised until its prediction at b covers what was measured, so the smaller batch it picks
// is judged by the memory the job really uses, not the estimate that was already wrong once.
// Pure functions of their inputs.
#ifndef FITRUN_SERVER_CORE_MEMORY_MEMORY_FEEDBACK_H_
#define FITRUN_SERVER_CORE_MEMORY_MEMORY_FEEDBACK_H_

#include <cstdint>

#include "fitrun/v1/job.pb.h"
#include "google/protobuf/repeated_field.h"
#include "server/core/memory/estimator.h"
#include "server/core/memory/model_profile.h"
#include "server/core/memory/planner.h"

namespace fitrun::server {

using OutOfMemoryHistory = google::protobuf::RepeatedPtrField<fitrun::v1::OutOfMemory>;

// The bytes an OOM shows the rank needed: at least what it held plus what it asked for.
int64_t MemoryNeededAt(const fitrun::v1::OutOfMemory& oom);

// Batches below the smallest one that ran out of memory, for the model as it ran (keeping or
// recomputing its activations); no bound for an empty history.
PlanLimits LimitsAfterOutOfMemory(const OutOfMemoryHistory& history);

// `model` with its per-sample bytes raised (a calibrated model: its measured curve scaled) so that,
// before the safety margin, the estimate at each OOM's batch is at least what that OOM showed was
// needed. Unchanged where the estimate already was.
ModelProfile ProfileAfterOutOfMemory(ModelProfile model, const fitrun::v1::JobSpec& spec,
                                     const OutOfMemoryHistory& history, const EstimatorOptions& estimator);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_MEMORY_FEEDBACK_H_
