#include "server/core/calibration/planning_gate.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/specs/workloads.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

bool NotMeasuredYet(MemoryCalibrator::State state) {
  return state == MemoryCalibrator::State::kMissing || state == MemoryCalibrator::State::kMeasuring;
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
    if (NotMeasuredYet(calibrator_->Find(workload, run_as).state)) return false;
  }
  return true;
}

std::string PlanningGate::LaunchesWithoutProbe(const fitrun::v1::Job& job,
                                               const std::vector<DeviceCapacity>& every_device,
                                               const Planner& planner) const {
  if (calibrator_ == nullptr) return "";
  if (!NotMeasuredYet(calibrator_->Find(job.spec(), job.run_as()).state)) return "";
  if (!AnalyticEstimateIsUpperBound(job.spec())) return "";
  absl::StatusOr<fitrun::v1::Plan> plan = planner(job, every_device);
  if (!plan.ok() || IsTight(*plan)) return "";
  return absl::StrCat("no memory probe: the analytic estimate, an upper bound, predicts ",
                      FormatBytes(plan->predicted().total_bytes()), " of ", FormatBytes(plan->usable_bytes()),
                      " usable, under half, so measuring cannot change the plan; the ranks' peaks are recorded "
                      "for the workload's calibration (a probe runs first only when memory is tight)");
}

std::string PlanningGate::AwaitCalibration(const fitrun::v1::JobSpec& spec, int64_t roomiest_bytes,
                                           const std::string& run_as) {
  if (calibrator_ == nullptr) return "";
  const int64_t per_rank = spec.resources().per_device_batch() > 0
                               ? spec.resources().per_device_batch()
                               : spec.global_batch_size() / std::max(1, spec.resources().min_devices());
  // Both models a plan may choose between are measured before either is planned: a model that
  // keeps its activations may fit nothing where the one recomputing them fits a large batch.
  const std::vector<fitrun::v1::JobSpec> workloads = PlannableWorkloads(spec);
  std::vector<std::string> measuring;
  for (size_t i = 0; i < workloads.size(); ++i) {
    if (!NotMeasuredYet(calibrator_->Find(workloads[i], run_as).state)) continue;
    calibrator_->StartCalibration(workloads[i], run_as, per_rank, roomiest_bytes, on_measured_);
    measuring.push_back(i == 0 ? "the workload" : "the model recomputing its activations");
  }
  if (measuring.empty()) return "";
  return absl::StrCat("measuring memory: fitrun-worker --probe runs ", absl::StrJoin(measuring, " and "),
                      " at growing micro-batches, up to ", per_rank, " or ", FormatBytes(roomiest_bytes));
}

std::string PlanningGate::AwaitPlanMeasurement(const fitrun::v1::JobSpec& spec, const fitrun::v1::Plan& plan,
                                               const std::string& run_as) {
  if (calibrator_ == nullptr) return "";
  if (spec.resources().per_device_batch() > 0) return "";  // a fixed batch is the user's call
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
  if (first_asked) awaiting->second = gate_->AwaitCalibration(job.spec(), roomiest_bytes_, job.run_as());
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
