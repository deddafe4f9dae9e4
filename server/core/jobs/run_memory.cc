#include "server/core/jobs/run_memory.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/jobs/first_steps.h"
#include "server/core/jobs/run_peaks.h"
#include "server/core/memory/device_costs.h"
#include "server/core/specs/workloads.h"

namespace fitrun::server {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;

void RunMemory::RecordAttempt(JobEntry& entry) {
  Job& job = entry.record.job;
  if (!entry.active || entry.active->out_of_memory || job.attempt_history().empty()) return;
  fitrun::v1::AttemptRecord& record = *job.mutable_attempt_history(job.attempt_history_size() - 1);
  // An attempt that predicted nothing (a script's first run, its own measurement) is measured too.
  if (record.attempt() != entry.active->attempt) return;
  // A rank stopped before its second step has not allocated everything a step keeps; one that
  // finished has.
  const int64_t enough_steps = std::min<int64_t>(2, std::max<int64_t>(1, job.plan().total_steps()));
  GpuRunPeaks gpu;
  int64_t measured = 0;
  for (const RankState& rank : entry.active->ranks) {
    if ((rank.peak_bytes <= 0 && rank.device_peak_bytes <= 0) || (rank.last_step < enough_steps && !rank.finished)) {
      continue;
    }
    measured = std::max(measured, rank.peak_bytes);
    gpu.reserved_bytes = std::max(gpu.reserved_bytes, rank.reserved_peak_bytes);
    gpu.device_bytes = std::max(gpu.device_bytes, rank.device_peak_bytes);
    // What the plan predicted is what fills the device: on a GPU the process's whole footprint.
    const int64_t observed = rank.device_peak_bytes > 0 ? rank.device_peak_bytes : rank.peak_bytes;
    if (record.predicted_peak_bytes() > 0) {
      metrics_->MemoryPredictionObserved(static_cast<double>(observed) /
                                         static_cast<double>(record.predicted_peak_bytes()));
    }
  }
  // A script that reported nothing on a GPU: its supervisor read only the driver's footprint.
  const bool from_footprint = measured <= 0 && gpu.device_bytes > 0;
  if (from_footprint) measured = AllocatedFromFootprintOf(entry, gpu.device_bytes);
  if (measured <= 0) return;
  record.set_measured_peak_bytes(measured);
  record.set_measured_reserved_peak_bytes(gpu.reserved_bytes);
  record.set_measured_device_peak_bytes(gpu.device_bytes);
  if (!LearnRunPeak(entry, record.per_device_batch(), measured, gpu.device_bytes)) return;
  gpu.allocated_bytes = measured;
  // Costs are learnt from the allocator's bytes beside the footprint, not from a figure derived by them.
  if (device_costs_ != nullptr && gpu.device_bytes > 0 && !from_footprint && record.device_ids_size() > 0) {
    for (const fitrun::v1::Device& device : inventory_->Snapshot()) {
      if (device.id() != record.device_ids(0) || device.kind() != fitrun::v1::DEVICE_KIND_CUDA) continue;
      device_costs_->RecordRun(job.run_as(), device.name(), job.plan().cuda_allocator_config(), gpu);
    }
  }
}

int64_t RunMemory::AllocatedFromFootprintOf(const JobEntry& entry, int64_t footprint) {
  const Job& job = entry.record.job;
  for (const fitrun::v1::Device& device : inventory_->Snapshot()) {
    if (entry.active->device_ids.empty() || device.id() != entry.active->device_ids.front()) continue;
    if (device.kind() != fitrun::v1::DEVICE_KIND_CUDA) return 0;
    return AllocatedFromFootprint(footprint, planner_->GpuCosts(device.name(), planner_->AllocatorConfigFor(job.spec()), job.run_as()));
  }
  return 0;
}

bool RunMemory::LearnRunPeak(JobEntry& entry, int64_t per_device_batch, int64_t measured, int64_t device_peak) {
  const Job& job = entry.record.job;
  // The figures are the ranks' word: what fitrund measured itself bounds them, and what passes
  // teaches only plans of the same account (CalibrationKey, DeviceCostsBook).
  if (const std::string impossible = ImpossiblePeak(*entry.active, inventory_->Snapshot(), std::max(measured, device_peak));
      !impossible.empty()) {
    JobEvent event;
    event.mutable_log()->set_rank(-1);
    event.mutable_log()->set_text(absl::StrCat("memory: ", impossible, "; this attempt's peaks are not learned from"));
    table_->Publish(entry, std::move(event));
    return false;
  }
  if (calibrator_ != nullptr) {
    // The calibration's curve is of ranks that keep every optimizer state; a sharded run's rank kept
    // its share, and teaches the curve what it would have peaked at with all of them.
    const int ranks = job.plan().device_ids_size();
    const int64_t unsharded_equivalent =
        measured + (job.plan().zero_stage() == 1 && ranks > 1
                        ? job.plan().predicted().optimizer_state_bytes() * (ranks - 1)
                        : 0);
    calibrator_->RecordRun(SpecAsPlanned(job.spec(), job.plan()), job.run_as(), per_device_batch,
                                          unsharded_equivalent);
  }
  return true;
}

void RunMemory::AfterFirstSteps(JobEntry& entry) {
  const std::optional<FirstStepsPeak> measured = FirstStepsDue(entry);
  if (!measured.has_value()) return;
  Job& job = entry.record.job;
  entry.active->first_steps_measured = true;
  if (!LearnRunPeak(entry, measured->per_device_batch, measured->peak_bytes, 0)) return;
  // Asked again with what the run measured, on the devices it holds (each with its whole memory).
  std::optional<fitrun::v1::Plan> move_to;
  if (job.measured_moves() == 0 && job.spec().resources().per_device_batch() == 0) {
    std::vector<DeviceCapacity> held;
    for (const fitrun::v1::Device& device : inventory_->Snapshot()) {
      const auto& ids = entry.active->device_ids;
      if (std::find(ids.begin(), ids.end(), device.id()) == ids.end()) continue;
      held.push_back(planner_->CapacityOf(device, device.total_bytes(), planner_->AllocatorConfigFor(job.spec()), job.run_as()));
    }
    absl::StatusOr<fitrun::v1::Plan> replanned = planner_->PlanForJob(job, held, /*host_room=*/-1);
    if (replanned.ok() && WorthMovingTo(job.plan(), *replanned)) move_to = *replanned;
  }
  entry.active->move_at_checkpoint = move_to;
  JobEvent event;
  event.mutable_log()->set_rank(-1);
  event.mutable_log()->set_text(DescribeFirstSteps(entry.active->attempt, *measured, job.plan(),
                                                   move_to.has_value() ? &*move_to : nullptr));
  table_->Publish(entry, std::move(event));
}

}  // namespace fitrun::server
