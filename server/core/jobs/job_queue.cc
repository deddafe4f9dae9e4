#include "server/core/jobs/job_queue.h"

namespace fitrun::server {

bool WaitsForPlacement(const fitrun::v1::Job& job, bool has_active_attempt) {
  const fitrun::v1::JobState state = job.state();
  // PLANNING without an attempt: waiting for its memory to be measured.
  return state == fitrun::v1::JOB_STATE_QUEUED ||
         ((state == fitrun::v1::JOB_STATE_RESTARTING || state == fitrun::v1::JOB_STATE_PLANNING) &&
          !has_active_attempt);
}

bool RunsBefore(const JobRecord& a, const JobRecord& b) {
  const bool a_ran = a.job.attempts() > 0;
  const bool b_ran = b.job.attempts() > 0;
  if (a_ran != b_ran) return a_ran;
  if (a.job.spec().priority() != b.job.spec().priority()) return a.job.spec().priority() > b.job.spec().priority();
  return a.submit_order < b.submit_order;
}

}  // namespace fitrun::server
