// The scheduler's decisions, one pass at a time: which queued jobs start now and on which devices
// (placement.h), what the others wait for (the planning gate: a workload's or a batch's
// measurement), and the plans an API call asks for (a submit's "could this ever run here", a dry
// run's plan). The loop that runs the passes, and starts the placed attempts with the lock
// released, is the job manager's.
//
// Thread-safety: none of its own; the job manager holds it under its lock, with the job table.
#ifndef FITRUN_SERVER_CORE_JOBS_SCHEDULER_H_
#define FITRUN_SERVER_CORE_JOBS_SCHEDULER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/calibration/planning_gate.h"
#include "server/core/jobs/attempt_launch.h"
#include "server/core/jobs/attempts.h"
#include "server/core/jobs/device_holders.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/jobs/job_planner.h"
#include "server/core/jobs/job_table.h"
#include "server/core/memory/planner.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

class Scheduler {
 public:
  struct Options {
    // The host memory every running job's ranks may be promised together; 0: not bounded here.
    int64_t host_memory_bytes = 0;
    // The caching allocator's settings a GPU device's capacity is judged with, for any job.
    std::string cuda_allocator_config;
  };
  // Every pointer must outlive this.
  Scheduler(Options options, JobTable* table, DeviceHolders* holders, Attempts* attempts, const JobPlanner* planner,
            PlanningGate* gate, WorkerLauncher* launcher)
      : options_(std::move(options)),
        table_(table),
        holders_(holders),
        attempts_(attempts),
        planner_(planner),
        gate_(gate),
        launcher_(launcher) {}

  // One pass's placing half: every queued job in queue order either placed (its attempt reserved,
  // Attempts::Reserve), told what it waits for, sent back to the queue, or failed when no plan can
  // exist. Returns the attempts to start, and how many jobs were queued.
  struct Placed {
    std::vector<PendingLaunch> launches;
    int queued = 0;
    // How long deciding took: the gate's questions and placement, before any job was moved.
    absl::Duration deciding;
  };
  Placed PlaceQueued();

  // At submit, for a spec already checked (Admission): whether the job could ever run on these
  // devices (INVALID_ARGUMENT naming the field when never; RESOURCE_EXHAUSTED when its measured
  // memory fits nowhere), and whether its workload's memory is measured before it may be planned.
  absl::StatusOr<bool> ProbeFirstAtSubmit(const fitrun::v1::JobSpec& spec, const std::string& run_as);
  // The plan the spec would get now (or once busy devices free up, saying so), never waiting for a
  // measurement: its reasons say what is still measured and what a plan would wait for.
  absl::StatusOr<fitrun::v1::Plan> DryRun(const fitrun::v1::JobSpec& spec, const std::string& run_as);

 private:
  absl::StatusOr<fitrun::v1::Plan> PlanOn(const fitrun::v1::JobSpec& spec, const std::string& run_as,
                                          bool only_free_devices);
  // Every device with its whole memory, as if idle (what a plan gets once the devices free up).
  std::vector<DeviceCapacity> EveryDeviceAsIfIdle();
  // The host memory not yet promised to running attempts' ranks (Plan.host_memory_bytes), or -1
  // when the host's is not bounded.
  int64_t UnpromisedHostMemory();
  // The planning gate's view: the planner's plan on devices as if the host were idle (its whole
  // host memory).
  PlanningGate::Planner GatePlanner();
  // Placement's, for one pass: the planner's plan within the host memory not yet promised to
  // running attempts nor to jobs placed earlier in the pass.
  PlanningGate::Planner PlacementPlanner();
  // Tells the job's watchers what it waits for in PLANNING (a state change into PLANNING, or a log
  // line when it is there already); nothing when that has not changed.
  void WaitInPlanning(JobEntry& entry, const std::string& waiting_for);

  const Options options_;
  JobTable* const table_;
  DeviceHolders* const holders_;
  Attempts* const attempts_;
  const JobPlanner* const planner_;
  PlanningGate* const gate_;
  WorkerLauncher* const launcher_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_SCHEDULER_H_
