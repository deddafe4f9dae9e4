#include "server/core/memory/planner.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/core/memory/plan_reasons.h"
#include "server/core/memory/plan_search.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

using fitrun::v1::JobSpec;
using fitrun::v1::Plan;

// How many devices and nodes a plan may take: the spec's bounds within the coordinator's.
struct Bounds {
  int min_devices = 1;
  int max_devices = 0;
  int min_nodes = 1;
  int max_nodes = 0;
};

absl::StatusOr<Bounds> BoundsOf(const JobSpec& spec, const std::vector<DeviceCapacity>& devices,
                                const PlanLimits& limits) {
  const auto& resources = spec.resources();
  Bounds bounds;
  bounds.min_devices = std::max(1, resources.min_devices());
  bounds.max_devices = resources.max_devices() > 0 ? resources.max_devices() : static_cast<int>(devices.size());
  if (limits.max_devices >= 0) {
    if (limits.max_devices < bounds.min_devices) {
      return absl::UnavailableError(absl::StrCat("needs ", bounds.min_devices,
                                                 " device(s) (spec.resources.min_devices), but ",
                                                 limits.max_devices_reason));
    }
    bounds.max_devices = std::min(bounds.max_devices, limits.max_devices);
  }
  bounds.min_nodes = std::max(1, resources.min_nodes());
  bounds.max_nodes = resources.max_nodes() > 0 ? resources.max_nodes() : std::numeric_limits<int>::max();
  if (limits.max_nodes > 0) {
    if (bounds.min_nodes > limits.max_nodes) {
      return absl::FailedPreconditionError(absl::StrCat("spec.resources.min_nodes: ", bounds.min_nodes,
                                                        " nodes, but ", limits.max_nodes_reason));
    }
    bounds.max_nodes = std::min(bounds.max_nodes, limits.max_nodes);
  }
  if (static_cast<int>(devices.size()) < bounds.min_devices) {
    return absl::UnavailableError(absl::StrCat("needs ", bounds.min_devices,
                                               " free device(s) (spec.resources.min_devices), ", devices.size(),
                                               " free now"));
  }
  return bounds;
}

// The devices a rank of the spec may run on, roomiest first (so n devices means the n with the most
// memory): CUDA ones only for fp16; one slice of each GPU for a built-in job (kOneRankPerGpu), while
// a script brings its own PyTorch, whose Gloo carries CUDA tensors between ranks on one GPU.
absl::StatusOr<std::vector<const DeviceCapacity*>> CandidateDevices(const JobSpec& spec,
                                                                    const std::vector<DeviceCapacity>& devices,
                                                                    int min_devices) {
  std::vector<const DeviceCapacity*> sorted;
  sorted.reserve(devices.size());
  const bool fp16 = spec.precision() == fitrun::v1::PRECISION_FP16;
  for (const DeviceCapacity& device : devices) {
    if (!fp16 || !device.gpu_model.empty()) sorted.push_back(&device);
  }
  if (fp16 && sorted.empty() && !devices.empty()) {
    return absl::InvalidArgumentError(
        "spec.precision: fp16 needs CUDA devices (it trains with autocast to float16 and a gradient scaler, which "
        "CPUs do not have), and this fitrund's devices are CPUs; use bf16 (autocast on CPUs) or fp32");
  }
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const DeviceCapacity* a, const DeviceCapacity* b) { return a->free_bytes > b->free_bytes; });
  if (spec.has_script()) return sorted;
  std::set<std::string> gpus;
  const size_t offered = sorted.size();
  sorted.erase(std::remove_if(sorted.begin(), sorted.end(),
                              [&gpus](const DeviceCapacity* d) {
                                const std::string gpu = GpuOf(*d);
                                return !gpu.empty() && !gpus.insert(gpu).second;
                              }),
               sorted.end());
  if (static_cast<int>(sorted.size()) < min_devices && sorted.size() < offered) {
    return absl::UnavailableError(absl::StrCat("needs ", min_devices, " devices, but with one rank per GPU ",
                                               sorted.size(), " are free (", kOneRankPerGpu, ")"));
  }
  return sorted;
}

// The plan one layout's choice makes, with its reasons.
Plan BuildPlan(const ChosenPlan& chosen) {
  const JobSpec& spec = chosen.spec;
  const ModelProfile& chosen_model = *chosen.choice.strategy.model;
  const RankBudget& budget = chosen.estimate.budget();
  const DeviceCosts& costs = chosen.estimate.costs();
  const int64_t batch = chosen.choice.batch;
  Plan plan;
  for (const DeviceCapacity* device : chosen.layout.devices) plan.add_device_ids(device->id);
  if (chosen.cluster) {
    for (const std::string& node : chosen.layout.node_names) plan.add_nodes(node);
    plan.set_devices_per_node(chosen.layout.per_node);
  }
  fitrun::v1::MemoryBreakdown predicted = chosen.predicted;
  if (costs.any() && !chosen_model.Unmeasured()) {
    // The reserve the allocator keeps grows only up to what the device leaves it.
    FitReserveToLimit(predicted, costs.capacity_binds_allocator_only ? budget.free_bytes
                                                                     : budget.free_bytes - costs.outside_allocator_bytes());
  }
  plan.set_per_device_batch(batch);
  plan.set_zero_stage(chosen.choice.strategy.sharded ? 1 : 0);
  plan.set_activation_checkpointing(chosen_model.activation_checkpointing);
  plan.set_grad_accum_steps(static_cast<int32_t>(budget.per_rank / batch));
  plan.set_learning_rate(ScaledLearningRate(spec.optimizer(), spec.global_batch_size()));
  *plan.mutable_predicted() = predicted;
  plan.set_usable_bytes(budget.usable_bytes);
  plan.set_steps_per_epoch(chosen.model.train_samples / spec.global_batch_size());
  plan.set_total_steps(spec.max_steps() > 0 ? spec.max_steps()
                                            : static_cast<int64_t>(spec.epochs()) * plan.steps_per_epoch());
  if (costs.any()) plan.set_cuda_allocator_config(costs.allocator_config);
  const ChosenPlan with_fitted{spec,          chosen.model,  chosen.layout, chosen.estimate,       chosen.choice,
                               predicted,     chosen.limits, chosen.cluster, chosen.offered_devices, chosen.rejected};
  AddPlanReasons(with_fitted, &plan);
  return plan;
}

// The error when no layout got a plan: why each was rejected, and what would fit.
absl::Status NoPlanFits(const JobSpec& spec, const ModelProfile& model, const std::vector<const DeviceCapacity*>& sorted,
                        const EstimatorOptions& estimator, int min_devices, const std::vector<std::string>& rejected) {
  std::string message = "no plan fits";
  for (const std::string& r : rejected) absl::StrAppend(&message, "; ", r);
  if (spec.resources().per_device_batch() > 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.resources.per_device_batch: ", message,
                                                   "; choose a per-device batch that divides global_batch_size / devices"));
  }
  if (std::all_of(rejected.begin(), rejected.end(),
                  [](const std::string& r) { return r.find("does not split evenly") != std::string::npos; })) {
    absl::StrAppend(&message, "; a global batch divisible by the device count would");
    return absl::ResourceExhaustedError(message);
  }
  absl::StrAppend(&message, WhatWouldFit(spec, model, sorted, estimator, spec.resources().memory_headroom(), min_devices));
  absl::StrAppend(&message, "; or a smaller model");
  return absl::ResourceExhaustedError(message);
}

}  // namespace

std::string GpuOf(const DeviceCapacity& device) {
  if (device.gpu_model.empty()) return "";
  return device.id.substr(0, device.id.find('#'));
}

double ScaledLearningRate(const fitrun::v1::OptimizerSpec& optimizer, int64_t global_batch_size) {
  const int64_t reference =
      optimizer.reference_batch_size() > 0 ? optimizer.reference_batch_size() : global_batch_size;
  const double ratio = static_cast<double>(global_batch_size) / static_cast<double>(reference);
  switch (optimizer.lr_scaling()) {
    case fitrun::v1::LR_SCALING_LINEAR: return optimizer.lr() * ratio;
    case fitrun::v1::LR_SCALING_SQRT: return optimizer.lr() * std::sqrt(ratio);
    default: return optimizer.lr();
  }
}

absl::StatusOr<Plan> PlanJob(const JobSpec& spec, const ModelProfile& model,
                             const std::vector<DeviceCapacity>& devices, const EstimatorOptions& estimator,
                             const PlanLimits& limits) {
  const int64_t global_batch = spec.global_batch_size();
  absl::StatusOr<Bounds> bounds = BoundsOf(spec, devices, limits);
  if (!bounds.ok()) return bounds.status();
  // A script's dataset is its own (train_samples 0): its epochs are its business.
  if (model.train_samples > 0 && model.train_samples < global_batch) {
    return absl::InvalidArgumentError(absl::StrCat("spec.global_batch_size: ", global_batch,
                                                   " is larger than the dataset's ", model.train_samples,
                                                   " training samples; use at most that"));
  }
  absl::StatusOr<std::vector<const DeviceCapacity*>> sorted = CandidateDevices(spec, devices, bounds->min_devices);
  if (!sorted.ok()) return sorted.status();
  const std::vector<Layout> layouts =
      LayoutsByPreference(*sorted, bounds->min_devices, bounds->max_devices, bounds->min_nodes, bounds->max_nodes);
  if (layouts.empty()) {
    return absl::UnavailableError(absl::StrCat("needs ", bounds->min_devices, " free device(s) on ", bounds->min_nodes,
                                               " node(s) or more with the same number free on each "
                                               "(spec.resources.min_devices, min_nodes), ",
                                               devices.size(), " free now"));
  }
  const bool cluster = std::any_of(devices.begin(), devices.end(), [](const DeviceCapacity& d) { return !d.node.empty(); });
  std::vector<std::string> rejected;  // why larger layouts were not chosen
  for (const Layout& layout : layouts) {
    const std::string described = DescribeLayout(layout, cluster);
    if (global_batch % static_cast<int64_t>(layout.devices.size()) != 0) {
      rejected.push_back(absl::StrCat(described, ": global batch ", global_batch, " does not split evenly"));
      continue;
    }
    if (spec.resources().per_device_batch() == 0 && !model.batch_not_plannable.empty()) {
      return absl::FailedPreconditionError(model.batch_not_plannable);
    }
    const RankBudget budget = BudgetOf(layout, global_batch, spec.resources().memory_headroom());
    const RankEstimate estimate(spec, estimator, budget);
    const BatchChoice choice = ChooseBatch(spec, model, StrategiesFor(spec, model, budget.ranks), estimate, limits, described);
    if (choice.batch == 0) {
      rejected.push_back(choice.rejected);
      continue;
    }
    const fitrun::v1::MemoryBreakdown predicted =
        choice.strategy.model->Unmeasured() ? fitrun::v1::MemoryBreakdown() : estimate.Breakdown(choice.strategy, choice.batch);
    return BuildPlan({spec, model, layout, estimate, choice, predicted, limits, cluster,
                      static_cast<int>(sorted->size()), rejected});
  }
  return NoPlanFits(spec, model, *sorted, estimator, bounds->min_devices, rejected);
}

}  // namespace fitrun::server
