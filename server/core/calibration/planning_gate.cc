#include "server/core/calibration/planning_gate.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/memory/memory_feedback.h"
#include "server/core/specs/workloads.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

bool NotMeasuredYet(MemoryCalibrator::State state) {
  return state == MemoryCalibrator::State::kMissing || state == MemoryCalibrator::State::kMeasuring;
}

// A script measured by its runs alone: what they bound is an upper bound, not the last word (the
// probe may still find a smaller batch that fits where they ran larger ones).
bool MeasuredByRunsOnly(const MemoryCalibrator::Lookup& lookup) {
  return lookup.state == MemoryCalibrator::State::kReady && lookup.calibration.from_runs_only;
}

// The workloads a plan of the spec may train: its own, and the same model recomputing its blocks'
// activations where the spec leaves that to the plan.
std::vector<fitrun::v1::JobSpec> PlannableWorkloads(const fitrun::v1::JobSpec& spec) {
  std::vector<fitrun::v1::JobSpec> workloads = {spec};
  if (!SpecActivationCheckpointing(spec).has_value()) workloads.push_back(WithActivationCheckpointing(spec, true));
  return workloads;
}

}  // namespace

bool IsTight(const fitrun::v1::Plan& plan) { return plan.predicted().total_bytes() > plan.usable_bytes() / 2; }

bool PlanningGate::Settled(const fitrun::v1::JobSpec& spec, const std::string& run_as) const {
  if (calibrator_ == nullptr) return true;
  for (const fitrun::v1::JobSpec& workload : PlannableWorkloads(spec)) {
    const MemoryCalibrator::Lookup lookup = calibrator_->Find(workload, run_as);
    if (NotMeasuredYet(lookup.state) || MeasuredByRunsOnly(lookup)) return false;
  }
  return true;
}

bool PlanningGate::MeasuringMayFindAPlan(const fitrun::v1::JobSpec& spec, const std::string& run_as) const {
  if (calibrator_ == nullptr || !spec.has_script() || SpecActivationCheckpointing(spec).has_value()) return false;
  return NotMeasuredYet(calibrator_->Find(WithActivationCheckpointing(spec, true), run_as).state);
}

std::string PlanningGate::LaunchesWithoutProbe(const fitrun::v1::Job& job,
                                               const std::vector<DeviceCapacity>& every_device,
                                               const Planner& planner) const {
  if (calibrator_ == nullptr) return "";
  const MemoryCalibrator::State state = calibrator_->Find(job.spec(), job.run_as()).state;
  if (state == MemoryCalibrator::State::kMissing && job.spec().has_script()) return LaunchesFromTheRun(job);
  if (!NotMeasuredYet(state)) return "";
  if (!AnalyticEstimateIsUpperBound(job.spec())) return "";
  absl::StatusOr<fitrun::v1::Plan> plan = planner(job, every_device);
  if (!plan.ok() || IsTight(*plan)) return "";
  return absl::StrCat("no memory probe: the analytic estimate, an upper bound, predicts ",
                      FormatBytes(plan->predicted().total_bytes()), " of ", FormatBytes(plan->usable_bytes()),
                      " usable, under half, so measuring cannot change the plan; the ranks' peaks are recorded "
                      "for the workload's calibration (a probe runs first only when memory is tight)");
}

std::string PlanningGate::LaunchesFromTheRun(const fitrun::v1::Job& job) const {
  const int ooms = job.oom_history_size();
  if (ooms == 0) {
    return "no memory probe: nothing has measured this script yet, and only running it can, so its first run "
           "is its measurement: it starts now at the batch the plan takes with the devices' whole memory, and its "
           "ranks' peaks in its first steps are recorded for the plans after it (an out-of-memory error re-plans "
           "a smaller batch, as for any job)";
  }
  // Once: a second error, or one where the plan could still choose to recompute activations, has the
  // script measured at smaller batches instead of guessing again.
  if (ooms == 1 && !MeasuringMayFindAPlan(job.spec(), job.run_as())) {
    return "no memory probe: re-planned from the out-of-memory error of its first run (the memory it needed "
           "there, all of it taken to grow with the batch); a second such error has it measured by the probe";
  }
  return "";
}

std::string PlanningGate::AwaitCalibration(const fitrun::v1::JobSpec& spec, int64_t roomiest_bytes,
                                           const std::string& run_as, int64_t below_batch, bool over_runs) {
  if (calibrator_ == nullptr) return "";
  const int64_t per_rank = spec.resources().per_device_batch() > 0
                         ? spec.resources().per_device_batch()
                         : spec.global_batch_size() / std::max(1, spec.resources().min_devices());
  // What ran out of memory need not be measured again (in the form that ran out: the model
  // recomputing its activations may still fit the batch).
  const int64_t own_form_max = below_batch > 1 ? std::min(per_rank, below_batch - 1) : per_rank;
  // Both models a plan may choose between are measured before either is planned: a model that
  // keeps its activations may fit nothing where the one recomputing them fits a large batch.
  const std::vector<fitrun::v1::JobSpec> workloads = PlannableWorkloads(spec);
  std::vector<std::string> measuring;
  for (size_t i = 0; i < workloads.size(); ++i) {
    const MemoryCalibrator::Lookup lookup = calibrator_->Find(workloads[i], run_as);
    if (!NotMeasuredYet(lookup.state) && !(over_runs && MeasuredByRunsOnly(lookup))) continue;
    calibrator_->StartCalibration(workloads[i], run_as, i == 0 ? own_form_max : per_rank, roomiest_bytes,
                                  on_measured_);
    measuring.push_back(i == 0 ? "the workload" : "the model recomputing its activations");
  }
  if (measuring.empty()) return "";
  return absl::StrCat("measuring memory: fitrun-worker --probe runs ", absl::StrJoin(measuring, " and "),
                      " at growing micro-batches, up to ", own_form_max, " or ", FormatBytes(roomiest_bytes));
}

std::string PlanningGate::SweepWhereRunsFitNothing(const fitrun::v1::Job& job,
                                                   const std::vector<DeviceCapacity>& every_device,
                                                   const Planner& planner, int64_t roomiest_bytes) {
  if (calibrator_ == nullptr || !MeasuredByRunsOnly(calibrator_->Find(job.spec(), job.run_as()))) return "";
  absl::StatusOr<fitrun::v1::Plan> plan = planner(job, every_device);
  if (plan.ok() || !absl::IsResourceExhausted(plan.status())) return "";
  const std::string waiting = AwaitCalibration(job.spec(), roomiest_bytes, job.run_as(), 0, /*over_runs=*/true);
  return waiting.empty() ? "" : absl::StrCat(waiting, " (its runs ran at batches too large for these devices)");
}

std::string PlanningGate::AwaitPlanMeasurement(const fitrun::v1::JobSpec& spec, const fitrun::v1::Plan& plan,
                                               const std::string& run_as) {
  if (calibrator_ == nullptr) return "";
  if (spec.resources().per_device_batch() > 0) return "";  // a fixed batch is the user's call
  // A script's own run measures its batch in its first steps: probing it first would start the script
  // once more for the same figure.
  if (spec.has_script()) return "";
  if (NotMeasuredYet(calibrator_->Find(spec, run_as).state)) {
    // The plan's strategy is a workload of its own (its activations recomputed), measured first
    // when the plan is tight, as any workload is.
    return IsTight(plan) ? AwaitCalibration(spec, plan.usable_bytes(), run_as) : "";
  }
  absl::StatusOr<ModelProfile> profile = calibrator_->ProfileFor(spec, run_as);
  if (!profile.ok() || !profile->measured.has_value()) return "";
  const int64_t batch = plan.per_device_batch();
  const MemoryCurve& curve = *profile->measured;
  if (curve.Measured(batch)) return "";
  const bool beyond = batch > curve.largest_batch();
  const bool tight = IsTight(plan);
  if (!beyond && !tight) return "";
  const bool queued = calibrator_->StartMeasurement(spec, run_as, batch, plan.usable_bytes(), on_measured_);
  if (!queued && !calibrator_->Measuring(spec, run_as, batch)) return "";  // it failed: go ahead
  return absl::StrCat("measuring the peak at per-device batch ", batch, " before launch (predicted ",
                      FormatBytes(plan.predicted().total_bytes()), " of ", FormatBytes(plan.usable_bytes()),
                      " usable, ", beyond ? curve.HowEstimated(batch) : "over half of it", ")");
}

PlanningGate::BeforePlanning PlanningGate::Pass::Check(const fitrun::v1::Job& job, const std::string& calibration_key,
                                                       bool in_planning) {
  BeforePlanning before;
  if (!gate_->measures()) return before;
  // Jobs of one shape get the same answer; a job with out-of-memory lessons is a shape of its own.
  const std::string shape = job.oom_history().empty()
                                ? absl::StrCat(calibration_key, "|", job.spec().global_batch_size(), "|",
                                               job.spec().resources().SerializeAsString())
                                : "";
  auto known = shape.empty() ? without_probe_by_shape_.end() : without_probe_by_shape_.find(shape);
  if (known != without_probe_by_shape_.end()) {
    before.without_probe = known->second;
  } else {
    before.without_probe = gate_->LaunchesWithoutProbe(job, every_device_, planner_);
    if (!shape.empty()) without_probe_by_shape_.emplace(shape, before.without_probe);
  }
  if (!before.without_probe.empty()) return before;
  auto [awaiting, first_asked] = awaiting_by_workload_.try_emplace(calibration_key);
  if (first_asked) {
    awaiting->second = gate_->AwaitCalibration(job.spec(), roomiest_bytes_, job.run_as(),
                                               LimitsAfterOutOfMemory(job.oom_history()).max_per_device_batch + 1);
    if (awaiting->second.empty()) {
      awaiting->second = gate_->SweepWhereRunsFitNothing(job, every_device_, planner_, roomiest_bytes_);
    }
  }
  before.waiting_for = awaiting->second;
  if (!before.waiting_for.empty()) {
    // Jobs behind may start meanwhile. One job per workload waits in PLANNING; the others stay
    // queued (their QUEUED reason says their memory is measured first).
    const bool first = waiting_in_planning_.insert(calibration_key).second;
    before.wait_in_planning = first || in_planning;
  }
  return before;
}

}  // namespace fitrun::server
