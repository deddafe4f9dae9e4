#include "server/core/jobs/placement.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/time/clock.h"
#include "server/core/calibration/memory_calibration.h"

namespace fitrun::server {

std::vector<Placement> PlaceQueuedJobs(const std::vector<JobEntry*>& queued, std::vector<DeviceCapacity> free_devices,
                                       PlanningGate::Pass& gate, const PlanningGate::Planner& planner) {
  std::vector<Placement> placements;
  for (JobEntry* entry : queued) {
    const fitrun::v1::Job& job = entry->record.job;
    const bool in_planning = job.state() == fitrun::v1::JOB_STATE_PLANNING;
    if (gate.measures() && entry->calibration_key.empty()) entry->calibration_key = CalibrationKey(job.spec(), job.run_as());
    const PlanningGate::BeforePlanning before = gate.Check(job, entry->calibration_key, in_planning);
    if (!before.waiting_for.empty()) {
      if (before.wait_in_planning) placements.push_back({entry, absl::UnknownError(""), before.waiting_for});
      continue;
    }
    const absl::Time planning_start = absl::Now();
    absl::StatusOr<fitrun::v1::Plan> plan = planner(job, free_devices);
    const absl::Duration planning = absl::Now() - planning_start;
    if (absl::IsUnavailable(plan.status())) {
      if (in_planning) placements.push_back({entry, std::move(plan), "", /*back_to_queue=*/true, planning});
      break;
    }
    std::string waiting;
    if (plan.ok()) {
      const std::set<std::string> taken(plan->device_ids().begin(), plan->device_ids().end());
      free_devices.erase(std::remove_if(free_devices.begin(), free_devices.end(),
                                        [&](const DeviceCapacity& d) { return taken.count(d.id) > 0; }),
                         free_devices.end());
      // Its devices stay out of this pass's free list while its batch is measured, and it keeps its
      // place in the queue on the next passes, so they are still there when the measurement is in.
      waiting = gate.BeforeLaunch(job, *plan);
      if (!before.without_probe.empty()) plan->add_reasons(before.without_probe);
    }
    placements.push_back({entry, std::move(plan), std::move(waiting), /*back_to_queue=*/false, planning});
  }
  return placements;
}

}  // namespace fitrun::server
