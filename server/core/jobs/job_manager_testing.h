// Test helpers over a real JobManager.
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_TESTING_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_TESTING_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

// An mlp on Fashion-MNIST with SGD, on `min_devices` to `max_devices` devices: what the core's tests
// submit when the workload does not matter.
inline fitrun::v1::JobSpec MlpSpec(const std::string& name, int64_t global_batch_size, int64_t max_steps,
                                   int min_devices, int max_devices) {
  fitrun::v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
  spec.mutable_optimizer()->set_lr(0.05);
  spec.set_global_batch_size(global_batch_size);
  spec.set_max_steps(max_steps);
  spec.mutable_resources()->set_min_devices(min_devices);
  spec.mutable_resources()->set_max_devices(max_devices);
  return spec;
}

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

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_TESTING_H_
