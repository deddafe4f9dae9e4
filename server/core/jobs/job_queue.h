// Which waiting jobs the scheduler considers, and in which order. The scheduler plans them in this
// order and stops at the first that does not fit (so a large job is never starved by small ones).
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_QUEUE_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_QUEUE_H_

#include "server/core/job_store.h"

namespace fitrun::server {

// A job waits for a placement when it is QUEUED, or RESTARTING or PLANNING with no attempt alive.
bool WaitsForPlacement(const fitrun::v1::Job& job, bool has_active_attempt);

// Jobs that already ran come first (a restarting job held devices a moment ago), then higher
// spec.priority, then submission order.
bool RunsBefore(const JobRecord& a, const JobRecord& b);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_QUEUE_H_
