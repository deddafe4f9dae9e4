#include "server/core/jobs/job_planner.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "server/core/jobs/attempt_launch.h"
#include "server/core/memory/memory_feedback.h"
#include "server/core/specs/workloads.h"
#include "server/core/units.h"

namespace fitrun::server {

using fitrun::v1::Job;
using fitrun::v1::JobSpec;
using fitrun::v1::Plan;

absl::StatusOr<Plan> JobPlanner::PlanWithinHost(const JobSpec& spec, const ModelProfile& profile,
                                                const std::vector<DeviceCapacity>& devices, PlanLimits limits,
                                                int64_t host_room) const {
  auto rank_bytes = [&](const DeviceCapacity& device) {
    return HostMemoryPerRank(spec, device.rank_host_bytes, options_.max_rank_host_memory_bytes);
  };
  if (host_room >= 0) {
    int64_t per_rank = 0;
    for (const DeviceCapacity& device : devices) per_rank = std::max(per_rank, rank_bytes(device));
    const int min_devices = std::max(1, spec.resources().min_devices());
    if (per_rank > 0 && host_room == options_.host_memory_bytes && host_room / per_rank < min_devices) {
      // Not even an idle host holds it: waiting cannot help.
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.resources.host_memory: ", min_devices, " rank(s) of ", FormatBytes(per_rank), " need more than the ",
          FormatBytes(host_room), " of host memory this fitrund promises its jobs (--host_memory); ask for less per "
          "rank (spec.resources.host_memory) or fewer devices (min_devices)"));
    }
    if (per_rank > 0) {
      limits.max_devices = static_cast<int>(std::min<int64_t>(host_room / per_rank, devices.size()));
      limits.max_devices_reason =
          absl::StrCat("their ranks' host memory (", FormatBytes(per_rank), " each, spec.resources.host_memory) ",
                       host_room == options_.host_memory_bytes ? "must fit in the host's " : "must fit in the ",
                       FormatBytes(host_room),
                       host_room == options_.host_memory_bytes ? " (fitrund --host_memory)"
                                                               : " the host has not promised to running jobs");
    }
  }
  absl::StatusOr<Plan> plan = PlanJob(spec, profile, devices, options_.estimator, limits);
  if (!plan.ok()) return plan;
  int64_t host_bytes = 0;
  for (const std::string& id : plan->device_ids()) {
    for (const DeviceCapacity& device : devices) {
      if (device.id == id) host_bytes += rank_bytes(device);
    }
  }
  plan->set_host_memory_bytes(host_bytes);
  return plan;
}

absl::StatusOr<Plan> JobPlanner::PlanForJob(const Job& job, const std::vector<DeviceCapacity>& devices,
                                            int64_t host_room) const {
  absl::StatusOr<ModelProfile> profile = ProfileFor(job.spec(), job.run_as());
  if (!profile.ok()) return profile.status();
  const ModelProfile corrected = ProfileAfterOutOfMemory(*profile, job.spec(), job.oom_history(), options_.estimator);
  PlanLimits limits = LimitsAfterOutOfMemory(job.oom_history());
  const PlanLimits nodes = NodeLimits();
  limits.max_nodes = nodes.max_nodes;
  limits.max_nodes_reason = nodes.max_nodes_reason;
  // A GPU's costs as this job's account's runs taught them, with the allocator settings its ranks
  // run with (a script may set its own).
  const std::string allocator_config = AllocatorConfigFor(job.spec());
  std::vector<DeviceCapacity> with_costs = devices;
  for (DeviceCapacity& device : with_costs) {
    if (device.gpu_model.empty()) continue;
    const bool slice = device.costs.capacity_binds_allocator_only;
    device.costs = GpuCosts(device.gpu_model, allocator_config, job.run_as());
    device.costs.capacity_binds_allocator_only = slice;
  }
  return PlanWithinHost(job.spec(), corrected, with_costs, limits, host_room);
}

DeviceCosts JobPlanner::GpuCosts(const std::string& gpu_model, const std::string& allocator_config,
                                 const std::string& run_as) const {
  return options_.device_costs != nullptr ? options_.device_costs->CostsFor(run_as, gpu_model, allocator_config)
                                          : DefaultCudaCosts(allocator_config);
}

DeviceCapacity JobPlanner::CapacityOf(const fitrun::v1::Device& device, int64_t bytes,
                                      const std::string& allocator_config, const std::string& run_as) const {
  DeviceCapacity capacity{device.id(), bytes, device.node()};
  capacity.rank_host_bytes = DefaultRankHostMemory(device);
  if (device.kind() != fitrun::v1::DEVICE_KIND_CUDA) return capacity;
  capacity.gpu_model = device.name();
  capacity.costs = GpuCosts(device.name(), allocator_config, run_as);
  capacity.costs.capacity_binds_allocator_only = device.slice_bytes() > 0;
  return capacity;
}

std::string JobPlanner::AllocatorConfigFor(const JobSpec& spec) const {
  if (spec.has_script()) {
    auto own = spec.script().env().find("PYTORCH_CUDA_ALLOC_CONF");
    if (own != spec.script().env().end()) return own->second;
  }
  return options_.cuda_allocator_config;
}

PlanLimits JobPlanner::NodeLimits() const {
  PlanLimits limits;
  limits.max_nodes = options_.max_nodes;
  limits.max_nodes_reason = options_.max_nodes_reason;
  return limits;
}

absl::StatusOr<ModelProfile> JobPlanner::ProfileFor(const JobSpec& spec, const std::string& run_as) const {
  const auto profile_of = [&](const JobSpec& workload) {
    return options_.memory_calibrator == nullptr ? server::ProfileFor(workload)
                                                 : options_.memory_calibrator->ProfileFor(workload, run_as);
  };
  absl::StatusOr<ModelProfile> profile = profile_of(spec);
  if (!profile.ok() || SpecActivationCheckpointing(spec).has_value()) return profile;
  // The spec leaves activation checkpointing to the plan: the recomputing model is a workload of its
  // own, planned on its own figures (measured once a plan takes it).
  absl::StatusOr<ModelProfile> recomputing = profile_of(WithActivationCheckpointing(spec, true));
  if (!recomputing.ok()) return recomputing.status();
  // A script recomputing as it does it is known only by measuring it: nothing stands for it before.
  if (spec.has_script() && (!recomputing->measured.has_value() || !recomputing->batch_not_plannable.empty())) {
    return profile;
  }
  profile->recomputing = std::make_shared<const ModelProfile>(RecomputingProfile(*profile, *std::move(recomputing)));
  return profile;
}

absl::StatusOr<Plan> JobPlanner::PlanForSpec(const JobSpec& spec, const std::string& run_as,
                                             const std::vector<DeviceCapacity>& devices, int64_t host_room) const {
  absl::StatusOr<ModelProfile> profile = ProfileFor(spec, run_as);
  if (!profile.ok()) return profile.status();
  return PlanWithinHost(spec, *profile, devices, NodeLimits(), host_room);
}

}  // namespace fitrun::server
