// JobManager, how queued jobs start: the scheduler thread and its passes, which ask placement
// (placement.h) which jobs start now and where and the planning gate (calibration/planning_gate.h)
// what they wait for, then launch each placed job's attempt. Same class, same mutex as
// job_manager.cc.
#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/jobs/attempt_launch.h"
#include "server/core/jobs/job_directory.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_queue.h"
#include "server/core/jobs/placement.h"
#include "server/core/jobs/proto_time.h"

namespace fitrun::server {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;
using fitrun::v1::JobSpec;
using fitrun::v1::Plan;

void JobManager::SchedulerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    // Wake for new work, or in time for the earliest pending deadline.
    const absl::Time now = options_.clock();
    const absl::Time wake = std::min(attempts_.CheckHeartbeats(now), attempts_.EndReportWaits(now));
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return table_.pass_requested() || shutting_down_; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
    if (shutting_down_) return;
    // A burst of submits, reports and exits is one pass, not one pass each: every pass walks the
    // queue under the lock the API's calls wait for.
    mu_.AwaitWithDeadline(absl::Condition(&shutting_down_), last_pass_ + options_.min_pass_spacing);
    if (shutting_down_) return;
    table_.TakePassRequest();

    attempts_.EndReportWaits(options_.clock());
    SchedulingPassTimes times;
    LaunchReserved(SchedulePass(times), times);
    last_pass_ = absl::Now();
    if (!forgotten_.empty()) {
      const std::vector<std::string> forgotten = std::exchange(forgotten_, {});
      mu_.Unlock();  // deleting a job's events takes a while; nothing waits for it
      DeleteJobRows(forgotten);
      mu_.Lock();
    }
  }
}

JobManager::SchedulingPassTimes JobManager::RunSchedulingPass() {
  SchedulingPassTimes times;
  std::vector<std::string> forgotten;
  {
    absl::MutexLock lock(&mu_);
    LaunchReserved(SchedulePass(times), times);
    forgotten = std::exchange(forgotten_, {});
  }
  DeleteJobRows(forgotten);
  return times;
}

std::vector<PendingLaunch> JobManager::SchedulePass(SchedulingPassTimes& times) {
  const absl::Time start = absl::Now();
  std::vector<JobEntry*> queued;
  for (auto& [id, entry] : table_.jobs()) {
    if (WaitsForPlacement(entry.record.job, entry.active.has_value())) queued.push_back(&entry);
  }
  times.queued = static_cast<int>(queued.size());
  std::sort(queued.begin(), queued.end(),
            [](const JobEntry* a, const JobEntry* b) { return RunsBefore(a->record, b->record); });
  std::vector<DeviceCapacity> free_devices;
  for (const fitrun::v1::Device& device : holders_.Devices(table_)) {
    if (device.job_id().empty()) {
      free_devices.push_back(planner_.CapacityOf(device, device.free_bytes(), options_.cuda_allocator_config));
    }
  }
  const std::vector<DeviceCapacity> every_device = EveryDeviceAsIfIdle();
  int64_t roomiest = 0;
  for (const DeviceCapacity& device : every_device) roomiest = std::max(roomiest, device.free_bytes);
  PlanningGate::Pass gate(&gate_, every_device, roomiest, GatePlanner());
  std::vector<Placement> placements = PlaceQueuedJobs(queued, std::move(free_devices), gate, PlacementPlanner());
  times.placing = absl::Now() - start;
  std::vector<PendingLaunch> launches;
  for (Placement& placement : placements) {
    JobEntry& entry = *placement.entry;
    if (!placement.waiting_for.empty()) {
      WaitInPlanning(entry, placement.waiting_for);
      continue;
    }
    if (placement.back_to_queue) {
      entry.waiting_for.clear();
      (void)table_.Transition(entry, fitrun::v1::JOB_STATE_QUEUED,
                       absl::StrCat("memory measured; waiting for devices: ", placement.plan.status().message()));
      continue;
    }
    entry.waiting_for.clear();
    if (entry.record.job.state() != fitrun::v1::JOB_STATE_PLANNING) {
      if (absl::Status status = table_.Transition(entry, fitrun::v1::JOB_STATE_PLANNING, "devices are free"); !status.ok()) {
        continue;
      }
    }
    if (!placement.plan.ok()) {
      entry.record.job.set_failure_reason(absl::StrCat("planning failed: ", placement.plan.status().message()));
      (void)table_.Transition(entry, fitrun::v1::JOB_STATE_FAILED, entry.record.job.failure_reason());
      continue;
    }
    launches.push_back(attempts_.Reserve(entry, placement));
  }
  // Here, where no caller holds an entry: forgetting erases entries (never one with an attempt).
  for (std::string& id : table_.ForgetExcess()) forgotten_.push_back(std::move(id));
  return launches;
}

void JobManager::LaunchReserved(std::vector<PendingLaunch> launches, SchedulingPassTimes& times) {
  const absl::Time start = absl::Now();
  for (PendingLaunch& launch : launches) {
    mu_.Unlock();
    absl::StatusOr<LaunchedAttempt> launched =
        StartRanks(launch, JobDirectoryPath(options_.jobs_dir, launch.job_id), launch_settings_, *launcher_);
    mu_.Lock();
    if (launched.ok()) ++times.placed;
    attempts_.Commit(launch, std::move(launched), shutting_down_ && options_.stop_workers_on_shutdown);
  }
  times.launching = absl::Now() - start;
}

void JobManager::AwaitLaunched(const std::string& job_id) {
  auto launched = [this, &job_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = table_.jobs().find(job_id);
    return it == table_.jobs().end() || !it->second.active || !it->second.active->launching;
  };
  mu_.Await(absl::Condition(&launched));
}

absl::StatusOr<Plan> JobManager::PlanOn(const JobSpec& spec, const std::string& run_as, bool only_free_devices) {
  std::vector<DeviceCapacity> capacities;
  for (const fitrun::v1::Device& device : holders_.Devices(table_)) {
    if (only_free_devices && !device.job_id().empty()) continue;
    // A free device's whole memory is the rank's; a busy one is planned as if idle.
    const int64_t bytes = only_free_devices ? device.free_bytes() : device.total_bytes();
    capacities.push_back(planner_.CapacityOf(device, bytes, planner_.AllocatorConfigFor(spec), run_as));
  }
  const int64_t host_room = only_free_devices ? UnpromisedHostMemory() : planner_.HostRoomWhenIdle();
  return planner_.PlanForSpec(spec, run_as, capacities, host_room);
}

int64_t JobManager::UnpromisedHostMemory() {
  if (options_.host_memory_bytes <= 0) return -1;
  int64_t promised = 0;
  for (const std::string& id : holders_.HoldingJobs()) {
    const JobEntry& entry = table_.jobs().at(id);
    if (entry.active) promised += entry.record.job.plan().host_memory_bytes();
  }
  return std::max<int64_t>(0, options_.host_memory_bytes - promised - launcher_->IdleHostBytes());
}

std::vector<DeviceCapacity> JobManager::EveryDeviceAsIfIdle() {
  std::vector<DeviceCapacity> every_device;
  for (const fitrun::v1::Device& device : holders_.Devices(table_)) {
    every_device.push_back(planner_.CapacityOf(device, device.total_bytes(), options_.cuda_allocator_config));
  }
  return every_device;
}

PlanningGate::Planner JobManager::GatePlanner() {
  // Called back only from the gate's and placement's calls, which run under mu_ (held here).
  return [this](const Job& job, const std::vector<DeviceCapacity>& devices) {
    return planner_.PlanForJob(job, devices, planner_.HostRoomWhenIdle());
  };
}

PlanningGate::Planner JobManager::PlacementPlanner() {
  // Jobs placed earlier in the pass have taken their share (as their devices), though not launched.
  auto room = std::make_shared<int64_t>(UnpromisedHostMemory());
  return [this, room](const Job& job, const std::vector<DeviceCapacity>& devices) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::StatusOr<Plan> plan = planner_.PlanForJob(job, devices, *room);
    if (plan.ok() && *room >= 0) *room = std::max<int64_t>(0, *room - plan->host_memory_bytes());
    return plan;
  };
}

void JobManager::WaitInPlanning(JobEntry& entry, const std::string& waiting_for) {
  if (entry.waiting_for == waiting_for) return;
  entry.waiting_for = waiting_for;
  if (entry.record.job.state() != fitrun::v1::JOB_STATE_PLANNING) {
    (void)table_.Transition(entry, fitrun::v1::JOB_STATE_PLANNING, waiting_for);
    return;
  }
  JobEvent event;
  event.mutable_log()->set_rank(-1);
  event.mutable_log()->set_text(absl::StrCat("planning: ", waiting_for));
  table_.Publish(entry, std::move(event));
}

}  // namespace fitrun::server
