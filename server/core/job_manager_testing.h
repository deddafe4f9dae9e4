// Test helpers over a real JobManager.
#ifndef FITRUN_SERVER_CORE_JOB_MANAGER_TESTING_H_
#define FITRUN_SERVER_CORE_JOB_MANAGER_TESTING_H_

#include <gtest/gtest.h>

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/core/job_manager.h"
#include "server/core/job_spec.h"

namespace fitrun::server {

// Waits (on the manager's own state, never a bare sleep) for the job to reach `state`; a test
// failure, and the job as it is, if it does not within 5 s.
inline fitrun::v1::Job WaitForState(JobManager& manager, const std::string& id, fitrun::v1::JobState state) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  fitrun::v1::Job job;
  while (absl::Now() < deadline) {
    job = *manager.Get(id);
    if (job.state() == state) return job;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ADD_FAILURE() << "job " << id << " is " << JobStateName(job.state()) << ", wanted " << JobStateName(state);
  return job;
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOB_MANAGER_TESTING_H_
