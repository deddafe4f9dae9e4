// The planning gate: whether a job is planned on its workload's measured memory or launches on its
// analytic estimate, and what it waits for in PLANNING meanwhile. This is where a job waits for
// calibration.
//
// A workload not measured yet is measured first (fitrun-worker --probe sweeps it) unless its
// analytic estimate is a checked upper bound and the plan it gets is roomy: then measuring could not
// change the plan, and the run's peaks calibrate the workload instead. A script is never probed
// before its first run: nothing but running it measures it, so that run is its measurement (a plan
// from the run), and its runs' peaks are its calibration; the probe sweeps it only after its runs ran
// out of memory (twice, or once where the plan could still choose to recompute its activations). A
// built-in model's plan whose batch is tight, or beyond the largest measured batch, has that batch
// measured before it launches; a script's run measures its own batch. Probes run on
// the calibrator's threads; the gate only starts them and says what the job waits for, and
// `on_measured` asks for another scheduling pass when one ends.
//
// Thread-safety: called under the job manager's lock; `on_measured` runs on a calibrator thread.
#ifndef FITRUN_SERVER_CORE_CALIBRATION_PLANNING_GATE_H_
#define FITRUN_SERVER_CORE_CALIBRATION_PLANNING_GATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/core/memory/planner.h"
#include "server/core/specs/workloads.h"

namespace fitrun::server {

class PlanningGate {
 public:
  // How a job is planned on some devices: the planner, with what the job's out-of-memory errors
  // taught (the job manager's).
  using Planner =
      std::function<absl::StatusOr<fitrun::v1::Plan>(const fitrun::v1::Job&, const std::vector<DeviceCapacity>&)>;

  // `calibrator` null: every plan is analytic and nothing waits.
  PlanningGate(MemoryCalibrator* calibrator, std::function<void()> on_measured)
      : calibrator_(calibrator), on_measured_(std::move(on_measured)) {}

  bool measures() const { return calibrator_ != nullptr; }

  // Whether the workload's memory is settled (and the recomputing model's, where the plan may
  // choose it): measured by the probe, or its measurement failed (its analytic verdict then
  // stands); a script measured by its runs alone is not. Only a settled workload's "does not fit" is
  // final at submit.
  bool Settled(const fitrun::v1::JobSpec& spec, const std::string& run_as) const;

  // Why the job launches on its analytic estimate without waiting for its workload's probe, or
  // empty when it waits: it does when the workload is measured already, when its analytic estimate
  // is not a checked upper bound, or when the plan it gets on `every_device` (each as if idle) is
  // tight (over half the usable memory: an estimate off by 2x could break it).
  std::string LaunchesWithoutProbe(const fitrun::v1::Job& job, const std::vector<DeviceCapacity>& every_device,
                                   const Planner& planner) const;

  // Why a script job nothing has measured launches now, its run its own measurement; empty when it
  // waits for the probe instead (after its out-of-memory errors: see the class comment).
  std::string LaunchesFromTheRun(const fitrun::v1::Job& job) const;

  // Whether measuring the spec could still find a plan where the runs found none: a script leaving
  // activation checkpointing to the plan whose recomputing form nothing has measured.
  bool MeasuringMayFindAPlan(const fitrun::v1::JobSpec& spec, const std::string& run_as) const;

  // What the job's workload still needs measured before it can be planned, with the sweep started
  // (up to the most one rank of the job takes in a micro-batch, below `below_batch` when that is over
  // 1 (a batch that ran out of memory), and `roomiest_bytes`); empty when nothing. Where the spec leaves activation checkpointing to the plan, the recomputing model is
  // a workload measured beside it. `run_as` here and below: the job's Job.run_as ("": fitrund's user), whose calibration
  // it is and whose account the probe runs as.
  // `over_runs`: a script measured by its runs alone is swept too.
  std::string AwaitCalibration(const fitrun::v1::JobSpec& spec, int64_t roomiest_bytes, const std::string& run_as,
                               int64_t below_batch = 0, bool over_runs = false);

  // A script measured by its runs alone whose runs bound no plan on `every_device` (each as if
  // idle: they ran larger batches than these devices hold): the probe sweeps it (started here), and
  // what the job waits for is returned; empty otherwise.
  std::string SweepWhereRunsFitNothing(const fitrun::v1::Job& job, const std::vector<DeviceCapacity>& every_device,
                                       const Planner& planner, int64_t roomiest_bytes);

  // What the plan still needs measured before it launches: its batch, when its predicted peak is
  // tight or beyond the largest measured batch and not measured yet (the measurement is started).
  // Empty when nothing, or when that measurement failed (the plan goes ahead).
  std::string AwaitPlanMeasurement(const fitrun::v1::JobSpec& spec, const fitrun::v1::Plan& plan,
                                   const std::string& run_as);

  // What one queued job waits for before it is planned now.
  struct BeforePlanning {
    // Non-empty: it launches on its analytic estimate; the reason goes into its plan.
    std::string without_probe;
    // Non-empty: its workload is being measured; it is not planned in this pass.
    std::string waiting_for;
    // While waiting: whether it is the job shown in PLANNING for its workload (one per workload;
    // the others stay QUEUED).
    bool wait_in_planning = false;
  };

  // One scheduling pass: every question is asked once per job shape or workload, however many
  // queued jobs share it (a queue of thousands plans each shape once).
  class Pass {
   public:
    Pass(PlanningGate* gate, std::vector<DeviceCapacity> every_device, int64_t roomiest_bytes, Planner planner)
        : gate_(gate), every_device_(std::move(every_device)), roomiest_bytes_(roomiest_bytes),
          planner_(std::move(planner)) {}

    // `calibration_key`: the job's workload's CalibrationKey; `in_planning`: the job already waits
    // in PLANNING.
    BeforePlanning Check(const fitrun::v1::Job& job, const std::string& calibration_key, bool in_planning);
    // What the plan waits for before it launches (AwaitPlanMeasurement); empty: launch it.
    std::string BeforeLaunch(const fitrun::v1::Job& job, const fitrun::v1::Plan& plan) {
      return gate_->AwaitPlanMeasurement(SpecAsPlanned(job.spec(), plan), plan, job.run_as());
    }
    bool measures() const { return gate_->measures(); }

   private:
    PlanningGate* const gate_;
    const std::vector<DeviceCapacity> every_device_;
    const int64_t roomiest_bytes_;
    const Planner planner_;
    std::map<std::string, std::string> without_probe_by_shape_;
    std::map<std::string, std::string> awaiting_by_workload_;
    std::set<std::string> waiting_in_planning_;
  };

 private:
  MemoryCalibrator* const calibrator_;
  const std::function<void()> on_measured_;
};

// A plan whose predicted peak is over half its usable memory: one an estimate off by 2x could break.
bool IsTight(const fitrun::v1::Plan& plan);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_CALIBRATION_PLANNING_GATE_H_
