#include "server/core/jobs/scheduler.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/jobs/job_queue.h"
#include "server/core/jobs/placement.h"

namespace fitrun::server {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;
using fitrun::v1::JobSpec;
using fitrun::v1::Plan;

Scheduler::Placed Scheduler::PlaceQueued() {
  const absl::Time start = absl::Now();
  std::vector<JobEntry*> queued;
  for (auto& [id, entry] : table_->jobs()) {
    if (WaitsForPlacement(entry.record.job, entry.active.has_value())) queued.push_back(&entry);
  }
  Placed placed;
  placed.queued = static_cast<int>(queued.size());
  std::sort(queued.begin(), queued.end(),
            [](const JobEntry* a, const JobEntry* b) { return RunsBefore(a->record, b->record); });
  std::vector<DeviceCapacity> free_devices;
  for (const fitrun::v1::Device& device : holders_->Devices(*table_)) {
    if (device.job_id().empty()) {
      free_devices.push_back(planner_->CapacityOf(device, device.free_bytes(), options_.cuda_allocator_config));
    }
  }
  const std::vector<DeviceCapacity> every_device = EveryDeviceAsIfIdle();
  int64_t roomiest = 0;
  for (const DeviceCapacity& device : every_device) roomiest = std::max(roomiest, device.free_bytes);
  PlanningGate::Pass gate(gate_, every_device, roomiest, GatePlanner());
  std::vector<Placement> placements = PlaceQueuedJobs(queued, std::move(free_devices), gate, PlacementPlanner());
  placed.deciding = absl::Now() - start;
  for (Placement& placement : placements) {
    JobEntry& entry = *placement.entry;
    if (!placement.waiting_for.empty()) {
      WaitInPlanning(entry, placement.waiting_for);
      continue;
    }
    if (placement.back_to_queue) {
      entry.waiting_for.clear();
      (void)table_->Transition(entry, fitrun::v1::JOB_STATE_QUEUED,
                       absl::StrCat("memory measured; waiting for devices: ", placement.plan.status().message()));
      continue;
    }
    entry.waiting_for.clear();
    if (entry.record.job.state() != fitrun::v1::JOB_STATE_PLANNING) {
      if (absl::Status status = table_->Transition(entry, fitrun::v1::JOB_STATE_PLANNING, "devices are free"); !status.ok()) {
        continue;
      }
    }
    if (!placement.plan.ok()) {
      entry.record.job.set_failure_reason(absl::StrCat("planning failed: ", placement.plan.status().message()));
      (void)table_->Transition(entry, fitrun::v1::JOB_STATE_FAILED, entry.record.job.failure_reason());
      continue;
    }
    placed.launches.push_back(attempts_->Reserve(entry, placement));
  }
  return placed;
}

absl::StatusOr<Plan> Scheduler::PlanOn(const JobSpec& spec, const std::string& run_as, bool only_free_devices) {
  std::vector<DeviceCapacity> capacities;
  for (const fitrun::v1::Device& device : holders_->Devices(*table_)) {
    if (only_free_devices && !device.job_id().empty()) continue;
    // A free device's whole memory is the rank's; a busy one is planned as if idle.
    const int64_t bytes = only_free_devices ? device.free_bytes() : device.total_bytes();
    capacities.push_back(planner_->CapacityOf(device, bytes, planner_->AllocatorConfigFor(spec), run_as));
  }
  const int64_t host_room = only_free_devices ? UnpromisedHostMemory() : planner_->HostRoomWhenIdle();
  return planner_->PlanForSpec(spec, run_as, capacities, host_room);
}

int64_t Scheduler::UnpromisedHostMemory() {
  if (options_.host_memory_bytes <= 0) return -1;
  int64_t promised = 0;
  for (const std::string& id : holders_->HoldingJobs()) {
    const JobEntry& entry = table_->jobs().at(id);
    if (entry.active) promised += entry.record.job.plan().host_memory_bytes();
  }
  return std::max<int64_t>(0, options_.host_memory_bytes - promised - launcher_->IdleHostBytes());
}

std::vector<DeviceCapacity> Scheduler::EveryDeviceAsIfIdle() {
  std::vector<DeviceCapacity> every_device;
  for (const fitrun::v1::Device& device : holders_->Devices(*table_)) {
    every_device.push_back(planner_->CapacityOf(device, device.total_bytes(), options_.cuda_allocator_config));
  }
  return every_device;
}

PlanningGate::Planner Scheduler::GatePlanner() {
  return [this](const Job& job, const std::vector<DeviceCapacity>& devices) {
    return planner_->PlanForJob(job, devices, planner_->HostRoomWhenIdle());
  };
}

PlanningGate::Planner Scheduler::PlacementPlanner() {
  // Jobs placed earlier in the pass have taken their share (as their devices), though not launched.
  auto room = std::make_shared<int64_t>(UnpromisedHostMemory());
  return [this, room](const Job& job, const std::vector<DeviceCapacity>& devices) {
    absl::StatusOr<Plan> plan = planner_->PlanForJob(job, devices, *room);
    if (plan.ok() && *room >= 0) *room = std::max<int64_t>(0, *room - plan->host_memory_bytes());
    return plan;
  };
}

void Scheduler::WaitInPlanning(JobEntry& entry, const std::string& waiting_for) {
  if (entry.waiting_for == waiting_for) return;
  entry.waiting_for = waiting_for;
  if (entry.record.job.state() != fitrun::v1::JOB_STATE_PLANNING) {
    (void)table_->Transition(entry, fitrun::v1::JOB_STATE_PLANNING, waiting_for);
    return;
  }
  JobEvent event;
  event.mutable_log()->set_rank(-1);
  event.mutable_log()->set_text(absl::StrCat("planning: ", waiting_for));
  table_->Publish(entry, std::move(event));
}

absl::StatusOr<bool> Scheduler::ProbeFirstAtSubmit(const JobSpec& spec, const std::string& run_as) {
  // A job that could never run on this node is refused now rather than queued forever. Its memory
  // is judged here only when its workload is measured: the analytic estimate is an upper bound, so
  // "does not fit" from it waits for the measurement, which runs off this call's path.
  const bool settled = gate_->Settled(spec, run_as);
  Job unplanned;
  *unplanned.mutable_spec() = spec;
  const bool probe_first = !settled && gate_->LaunchesWithoutProbe(unplanned, EveryDeviceAsIfIdle(), GatePlanner()).empty();
  absl::StatusOr<Plan> feasible = PlanOn(spec, run_as, /*only_free_devices=*/false);
  if (!feasible.ok()) {
    if (absl::IsUnavailable(feasible.status())) {
      return absl::InvalidArgumentError(absl::StrCat("spec.resources.min_devices: ", feasible.status().message(),
                                                     " on this node in all; lower min_devices"));
    }
    if (settled || !absl::IsResourceExhausted(feasible.status())) return feasible.status();
  }
  return probe_first;
}

absl::StatusOr<Plan> Scheduler::DryRun(const JobSpec& spec, const std::string& run_as) {
  // Never waits for a probe: an unmeasured workload is planned with the analytic estimate while
  // its measurement starts, and the plan says so.
  Job unplanned;
  *unplanned.mutable_spec() = spec;
  const std::string without_probe = gate_->LaunchesWithoutProbe(unplanned, EveryDeviceAsIfIdle(), GatePlanner());
  int64_t roomiest = 0;
  for (const DeviceCapacity& device : EveryDeviceAsIfIdle()) roomiest = std::max(roomiest, device.free_bytes);
  const std::string calibrating = without_probe.empty() ? gate_->AwaitCalibration(spec, roomiest, run_as) : "";
  absl::StatusOr<Plan> plan = PlanOn(spec, run_as, /*only_free_devices=*/true);
  if (absl::IsUnavailable(plan.status())) {
    // Busy devices: show the plan it gets once they free up.
    plan = PlanOn(spec, run_as, /*only_free_devices=*/false);
    if (plan.ok()) plan->add_reasons("queued: not enough devices are free now; this is the plan once they are");
  }
  const std::string pending = absl::StrCat(
      calibrating, ": this is the analytic estimate, an upper bound; plan again in a few seconds for a calibrated one");
  if (!plan.ok()) {
    if (!calibrating.empty()) return absl::Status(plan.status().code(), absl::StrCat(plan.status().message(), " (", pending, ")"));
    return plan.status();
  }
  if (!without_probe.empty()) {
    plan->add_reasons(without_probe);
  } else if (!calibrating.empty()) {
    plan->add_reasons(pending);
  } else if (const std::string measuring = gate_->AwaitPlanMeasurement(spec, *plan, run_as); !measuring.empty()) {
    plan->add_reasons(absl::StrCat("before launch: ", measuring));
  }
  return plan;
}

}  // namespace fitrun::server
