// Placement: which queued jobs start now and where. Jobs are taken in queue order (job_queue.h);
// each is planned on the devices still free after the jobs before it took theirs, so one pass
// decides many launches without planning two jobs onto one device. The head job that waits for
// devices stops the pass: nothing behind it jumps ahead, so a large job is never starved by a stream
// of small ones. A job whose workload is being measured waits (planning_gate.h) without holding the
// queue up.
//
// Thread-safety: the job manager calls it under its lock; it changes nothing but the entries'
// cached calibration keys.
#ifndef FITRUN_SERVER_CORE_JOBS_PLACEMENT_H_
#define FITRUN_SERVER_CORE_JOBS_PLACEMENT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/calibration/planning_gate.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/memory/planner.h"

namespace fitrun::server {

// What the scheduler does with one queued job: launch it with `plan`, fail it (the planner's
// error), let it wait in PLANNING while its memory is measured (`waiting_for` says what), or send it
// back to QUEUED until devices free up (`back_to_queue`, for a job that waited in PLANNING).
struct Placement {
  JobEntry* entry = nullptr;
  absl::StatusOr<fitrun::v1::Plan> plan;
  std::string waiting_for;
  bool back_to_queue = false;
  // How long planning it took in this pass.
  absl::Duration planning;
};

// `queued`: the jobs waiting for placement, in queue order. `free_devices`: the devices no rank
// holds, with the memory free on each. `gate`: this pass of the planning gate. `planner`: plans a job
// on devices, with what its out-of-memory errors taught.
std::vector<Placement> PlaceQueuedJobs(const std::vector<JobEntry*>& queued, std::vector<DeviceCapacity> free_devices,
                                       PlanningGate::Pass& gate, const PlanningGate::Planner& planner);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_PLACEMENT_H_
