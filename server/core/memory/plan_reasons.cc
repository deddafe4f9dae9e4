#include "server/core/memory/plan_reasons.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

using fitrun::v1::JobSpec;
using fitrun::v1::Plan;

const char* ScalingName(fitrun::v1::LrScaling scaling) {
  switch (scaling) {
    case fitrun::v1::LR_SCALING_LINEAR: return "linear";
    case fitrun::v1::LR_SCALING_SQRT: return "sqrt";
    default: return "none";
  }
}

std::string DevicesReason(const ChosenPlan& c) {
  const auto& resources = c.spec.resources();
  const int n = static_cast<int>(c.layout.devices.size());
  std::string why = absl::StrCat("devices: ", n, " (", c.offered_devices, " free, spec allows ",
                                 std::max(1, resources.min_devices()), "..",
                                 resources.max_devices() > 0 ? absl::StrCat(resources.max_devices()) : "any",
                                 "); more devices means more samples per second");
  if (c.cluster) {
    absl::StrAppend(&why, "; nodes: ", c.layout.nodes, " x ", c.layout.per_node, " devices (",
                    absl::StrJoin(c.layout.node_names, ", "), "), the fewest nodes that hold them: ranks on one node "
                    "talk faster than across nodes");
    if (c.limits.max_nodes > 0 && !c.limits.max_nodes_reason.empty()) {
      absl::StrAppend(&why, "; at most ", c.limits.max_nodes, " node(s): ", c.limits.max_nodes_reason);
    }
  }
  if (c.limits.max_devices >= 0 && n == c.limits.max_devices && n < c.offered_devices) {
    absl::StrAppend(&why, "; at most ", c.limits.max_devices, " now: ", c.limits.max_devices_reason);
  }
  for (const std::string& r : c.rejected) absl::StrAppend(&why, "; not ", r);
  return why;
}

std::string BatchReason(const ChosenPlan& c) {
  const ModelProfile& chosen_model = *c.choice.strategy.model;
  const RankBudget& budget = c.estimate.budget();
  const int64_t chosen = c.choice.batch;
  const bool fixed = c.spec.resources().per_device_batch() > 0;
  const int64_t bound = c.limits.MaxPerDeviceBatch(chosen_model.activation_checkpointing);
  if (chosen_model.Unmeasured()) {
    return absl::StrCat(
        "per_device_batch: ", chosen,
        fixed ? " fixed by spec.resources.per_device_batch"
              : absl::StrCat(", the largest divisor of the ", budget.per_rank, " samples each device takes per step",
                             bound > 0 ? absl::StrCat(" up to ", bound) : ""),
        "; no peak is predicted: nothing has measured the script yet, so it runs with the device's memory (",
        FormatBytes(budget.usable_bytes), " usable on ", budget.tightest->id, ") and its first steps measure its peak");
  }
  const int64_t charged = ChargedBytes(c.predicted, c.estimate.costs());
  const std::string how = chosen_model.measured.has_value()
                              ? absl::StrCat("; its peak is ", chosen_model.measured->HowEstimated(chosen))
                              : "";
  if (fixed) {
    return absl::StrCat("per_device_batch: ", chosen, " fixed by spec.resources.per_device_batch; predicted peak ",
                        FormatBytes(charged), " against ", FormatBytes(budget.usable_bytes), " usable",
                        charged > budget.usable_bytes ? " (PREDICTED NOT TO FIT)" : "", how);
  }
  std::string why = absl::StrCat("per_device_batch: ", chosen, ", the largest divisor of the ", budget.per_rank,
                                 " samples each device takes per step whose predicted peak (", FormatBytes(charged),
                                 ") fits the ", FormatBytes(budget.usable_bytes), " usable on ", budget.tightest->id, " (",
                                 FormatBytes(budget.free_bytes), " free less ",
                                 absl::StrFormat("%.0f%%", budget.headroom * 100), " headroom)", how);
  if (bound > 0) {
    absl::StrAppend(&why, "; at most ", bound, " because a larger batch ran out of memory in an earlier attempt");
  }
  return why;
}

// Why the optimizer states are sharded: the spec, or what keeping them whole would have given.
std::string WhySharding(const ChosenPlan& c) {
  const bool pinned = c.spec.ddp().has_zero_stage() && c.spec.ddp().zero_stage() == 1;
  if (pinned) return "spec.ddp.zero_stage is 1";
  const Strategy whole{c.choice.strategy.model, false};
  const int64_t chosen = c.choice.batch;
  if (c.spec.resources().per_device_batch() > 0) {
    return absl::StrCat("the fixed per-device batch fits only with them (", FormatBytes(c.estimate.Charged(whole, chosen)),
                        " unsharded)");
  }
  const int64_t whole_batch = c.estimate.LargestFitting(whole, c.limits);
  if (whole_batch == 0) {
    return absl::StrCat("without them even per-device batch 1 needs ", FormatBytes(c.estimate.Charged(whole, 1)));
  }
  const int64_t per_rank = c.estimate.budget().per_rank;
  return absl::StrCat("they fit per-device batch ", chosen, " where keeping every state on every rank fits ", whole_batch,
                      " (", per_rank / chosen, " instead of ", per_rank / whole_batch, " accumulation passes)");
}

std::string ShardingReason(const ChosenPlan& c) {
  const int n = c.estimate.budget().ranks;
  if (c.spec.has_script()) {
    return absl::StrCat("zero_stage: 1, optimizer states sharded over the ", n, " ranks, because ", WhySharding(c),
                        "; the script shards them (FITRUN_ZERO_STAGE=1); its probe ran one rank, so the predicted peak "
                        "keeps every state on every rank");
  }
  return absl::StrCat("zero_stage: 1, optimizer states sharded over the ", n, " ranks (",
                      FormatBytes(c.predicted.optimizer_state_bytes()), " per rank), because ", WhySharding(c),
                      "; each rank steps its share and broadcasts it after the step");
}

std::string CheckpointingReason(const ChosenPlan& c) {
  const Strategy kept{&c.model, c.choice.strategy.sharded};
  std::string why = "it is predicted the fastest way to train (see strategy)";
  if (c.model.recomputing == nullptr) {
    why = c.spec.has_script() ? "spec.script.activation_checkpointing is true" : "the spec's model config sets it";
  } else if (c.spec.resources().per_device_batch() > 0) {
    why = "the fixed per-device batch fits only so";
  } else if (c.estimate.LargestFitting(kept, c.limits) == 0) {
    why = absl::StrCat("without it even per-device batch 1 needs ", FormatBytes(c.estimate.Charged(kept, 1)));
  }
  return absl::StrCat("activation_checkpointing: each block's activations recomputed in backward (",
                      FormatBytes(c.predicted.activations_bytes()), " of activations at this batch), because ", why,
                      c.spec.has_script() ? "; the script recomputes them (FITRUN_ACTIVATION_CHECKPOINTING=1)" : "");
}

void AddAccumulationReasons(const ChosenPlan& c, Plan* plan) {
  const int n = c.estimate.budget().ranks;
  const int64_t chosen = c.choice.batch;
  plan->add_reasons(absl::StrCat("grad_accum_steps: ", plan->grad_accum_steps(), " so that ", n, " x ", chosen, " x ",
                                 plan->grad_accum_steps(), " = global batch ", c.spec.global_batch_size()));
  if (!c.spec.has_script() || plan->grad_accum_steps() <= 1) return;
  const std::string& flag = c.spec.script().grad_accum_flag();
  plan->add_reasons(absl::StrCat("the script must accumulate gradients over ", plan->grad_accum_steps(),
                                 " micro-batches per optimizer step (FITRUN_GRAD_ACCUM_STEPS",
                                 flag.empty() ? "" : absl::StrCat(", or ", flag), "); one that does not trains on a "
                                 "global batch of ", n * chosen,
                                 flag.empty() ? " (spec.script.grad_accum_flag passes it as a flag)" : ""));
}

std::string CostsReason(const ChosenPlan& c) {
  const DeviceCosts& costs = c.estimate.costs();
  return absl::StrCat(
      "device memory beyond the tensors: the caching allocator's reserve ",
      FormatBytes(c.predicted.allocator_reserve_bytes()),
      absl::StrFormat(" (it keeps up to %.2fx what it hands out where memory allows, needs %.2fx to train; "
                      "PYTORCH_CUDA_ALLOC_CONF=%s)",
                      costs.reserve_ratio, costs.needed_ratio,
                      costs.allocator_config.empty() ? "unset" : costs.allocator_config),
      ", the CUDA context ", FormatBytes(c.predicted.cuda_context_bytes()), ", the libraries' workspaces ",
      FormatBytes(c.predicted.library_workspace_bytes()), ", the collectives' buffers ",
      FormatBytes(c.predicted.communication_bytes()),
      costs.capacity_binds_allocator_only ? "; the slice's cap binds the allocator alone, the rest lies outside it" : "",
      "; from ", costs.source);
}

std::string LearningRateReason(const JobSpec& spec, const Plan& plan) {
  return absl::StrFormat("learning_rate: %g (spec lr %g, lr_scaling %s against reference batch %d)",
                         plan.learning_rate(), spec.optimizer().lr(), ScalingName(spec.optimizer().lr_scaling()),
                         spec.optimizer().reference_batch_size() > 0 ? spec.optimizer().reference_batch_size()
                                                                     : spec.global_batch_size());
}

// Autocast to bf16 keeps fp32 weights, gradients and optimizer state and roughly 0.6x the fp32
// activations (measured by the probe: gpt 0.66x, mlp 0.61x); a rough figure for suggestions only.
constexpr double kBf16ActivationRatio = 0.6;

}  // namespace

std::string WhatWouldFit(const JobSpec& spec, const ModelProfile& model, const std::vector<const DeviceCapacity*>& sorted,
                         const EstimatorOptions& estimator, double headroom, int min_devices) {
  const auto usable = [headroom](int64_t free_bytes) {
    return static_cast<int64_t>(static_cast<double>(free_bytes) * (1.0 - headroom));
  };
  const DeviceCosts costs = sorted.empty() ? DeviceCosts{} : sorted[0]->costs;
  const int64_t need = ChargedBytes(EstimateRankMemory(model, spec, 1, estimator, costs), costs);
  std::string out = absl::StrCat("; what would fit: per-device batch 1 (the smallest) needs ", FormatBytes(need),
                                 ", so devices with ",
                                 FormatBytes(static_cast<int64_t>(std::ceil(need / (1.0 - headroom)))),
                                 " free each (at ", absl::StrFormat("%.0f%%", headroom * 100), " headroom)");
  int fitting = 0;  // how many of the roomiest devices fit batch 1
  while (fitting < static_cast<int>(sorted.size()) && usable(sorted[fitting]->free_bytes) >= need) ++fitting;
  if (fitting > 0 && fitting < min_devices) {
    absl::StrAppend(&out, "; or fewer devices: ", fitting, " device(s) (", sorted[0]->id,
                    fitting > 1 ? ", ..." : "", ") fit batch 1, so spec.resources.min_devices: ", fitting);
  }
  const bool fp32 = spec.precision() == fitrun::v1::PRECISION_FP32 ||
                    spec.precision() == fitrun::v1::PRECISION_UNSPECIFIED;
  if (fp32 && spec.model().kind_case() != fitrun::v1::ModelSpec::kTorchscript) {
    ModelProfile bf16 = model;
    bf16.activation_bytes_per_sample =
        static_cast<int64_t>(static_cast<double>(bf16.activation_bytes_per_sample) * kBf16ActivationRatio);
    if (model.measured.has_value()) {
      // The measured curve's batch-dependent part shrinks, its batch-independent part stays.
      const int64_t fixed = model.measured->FixedBytes();
      std::vector<MeasuredPeak> points = model.measured->points();
      for (MeasuredPeak& p : points) {
        p.peak_bytes = fixed + static_cast<int64_t>(static_cast<double>(p.peak_bytes - fixed) * kBf16ActivationRatio);
      }
      bf16.measured = MemoryCurve(std::move(points));
    }
    JobSpec bf16_spec = spec;
    bf16_spec.set_precision(fitrun::v1::PRECISION_BF16);
    // The largest per-device batch bf16 would fit on the roomiest device.
    const int64_t budget = sorted.empty() ? 0 : usable(sorted[0]->free_bytes);
    const int64_t per_rank = spec.global_batch_size() / std::max(1, min_devices);
    int64_t best = 0;
    for (int64_t b : DivisorsDescending(per_rank)) {
      if (ChargedBytes(EstimateRankMemory(bf16, bf16_spec, b, estimator, costs), costs) <= budget) {
        best = b;
        break;
      }
    }
    if (best > 0) {
      absl::StrAppend(&out, "; or spec.precision: bf16, estimated at about ",
                      FormatBytes(ChargedBytes(EstimateRankMemory(bf16, bf16_spec, best, estimator, costs), costs)),
                      " for per-device batch ", best, " (activations about 0.6x fp32's)");
    }
  }
  return out;
}

void AddPlanReasons(const ChosenPlan& c, Plan* plan) {
  const ModelProfile& chosen_model = *c.choice.strategy.model;
  plan->add_reasons(DevicesReason(c));
  plan->add_reasons(BatchReason(c));
  if (c.choice.strategy.sharded) plan->add_reasons(ShardingReason(c));
  if (chosen_model.activation_checkpointing) plan->add_reasons(CheckpointingReason(c));
  if (!c.choice.weighed.empty()) {
    plan->add_reasons(absl::StrCat("strategy: ",
                                   DescribeStrategy(c.choice.strategy, c.estimate.budget().ranks, c.model.recomputing != nullptr),
                                   ", predicted the fastest of those that fit (", absl::StrJoin(c.choice.weighed, "; "),
                                   "); ", StepTimeModelText(c.model)));
  }
  AddAccumulationReasons(c, plan);
  if (!chosen_model.memory_source.empty()) plan->add_reasons(absl::StrCat("memory estimate: ", chosen_model.memory_source));
  if (c.estimate.costs().any() && !chosen_model.Unmeasured()) plan->add_reasons(CostsReason(c));
  plan->add_reasons(LearningRateReason(c.spec, *plan));
}

}  // namespace fitrun::server
