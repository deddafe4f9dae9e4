// What an attempt's run taught about memory: its ranks' peaks against the plan's prediction, given
// to the calibration (the workload's curve) and the device costs (a GPU model's overheads) unless
// fitrund's own figures say they cannot be true, and, after a script's first steps, whether a larger
// batch now fits (first_steps.h).
//
// Thread-safety: none of its own; the job manager calls it under its lock. The calibrator and the
// cost book guard themselves.
#ifndef FITRUN_SERVER_CORE_JOBS_RUN_MEMORY_H_
#define FITRUN_SERVER_CORE_JOBS_RUN_MEMORY_H_

#include <cstdint>

#include "server/core/calibration/device_costs_book.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/device_inventory.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/jobs/job_planner.h"
#include "server/core/jobs/job_table.h"

namespace fitrun::server {

class RunMemory {
 public:
  // `calibrator` and `device_costs` may be null (nothing is learnt then); every pointer must
  // outlive this.
  RunMemory(const JobPlanner* planner, JobTable* table, DeviceInventory* inventory, CoordinatorMetrics* metrics,
            MemoryCalibrator* calibrator, DeviceCostsBook* device_costs)
      : planner_(planner),
        table_(table),
        inventory_(inventory),
        metrics_(metrics),
        calibrator_(calibrator),
        device_costs_(device_costs) {}

  // The memory a finished attempt's ranks reported against its plan: recorded on the attempt, in the
  // metrics, and with the calibrator, which corrects the workload's curve from it.
  void RecordAttempt(JobEntry& entry);
  // After a report of a script job's rank: once its first steps measured the attempt's batch
  // (first_steps.h), learns the peak, asks the plan again and, where it now takes a larger batch,
  // marks the attempt to move there at its next checkpoint.
  void AfterFirstSteps(JobEntry& entry);

 private:
  // The allocator's bytes a GPU rank's whole footprint (NVML's figure) stands for on the attempt's
  // device (AllocatedFromFootprint with its model's costs); 0 on a CPU device.
  int64_t AllocatedFromFootprintOf(const JobEntry& entry, int64_t footprint);
  // Gives a run's peak at `per_device_batch` (its ranks' highest, allocator bytes; `device_peak` the
  // process's whole footprint on a GPU, 0 elsewhere) to the calibration, unless fitrund's own
  // figures say it cannot be true (then its watchers are told, and false is returned).
  bool LearnRunPeak(JobEntry& entry, int64_t per_device_batch, int64_t measured, int64_t device_peak);

  const JobPlanner* const planner_;
  JobTable* const table_;
  DeviceInventory* const inventory_;
  CoordinatorMetrics* const metrics_;
  MemoryCalibrator* const calibrator_;
  DeviceCostsBook* const device_costs_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_RUN_MEMORY_H_
