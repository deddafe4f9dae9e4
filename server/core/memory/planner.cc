#include "server/core/memory/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

using fitrun::v1::JobSpec;
using fitrun::v1::Plan;

// Divisors of n, largest first.
std::vector<int64_t> DivisorsDescending(int64_t n) {
  std::vector<int64_t> small, large;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    small.push_back(d);
    if (d != n / d) large.push_back(n / d);
  }
  std::vector<int64_t> out(large.begin(), large.end());
  out.insert(out.end(), small.rbegin(), small.rend());
  return out;
}

const char* ScalingName(fitrun::v1::LrScaling scaling) {
  switch (scaling) {
    case fitrun::v1::LR_SCALING_LINEAR: return "linear";
    case fitrun::v1::LR_SCALING_SQRT: return "sqrt";
    default: return "none";
  }
}

// Autocast to bf16 keeps fp32 weights, gradients and optimizer state and roughly 0.6x the fp32
// activations (measured by the probe: gpt 0.66x, mlp 0.61x); a rough figure for suggestions only.
constexpr double kBf16ActivationRatio = 0.6;

// What would fit when nothing does: the smallest batch's need, fewer devices, bf16.
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

// n devices on `nodes` nodes, `per_node` each, in rank order (node by node).
struct Layout {
  int nodes = 1;
  int per_node = 0;
  // Pointers into the caller's devices: a DeviceCapacity carries its GPU costs, and copying them for
  // every layout of every pass made planning twice as slow.
  std::vector<const DeviceCapacity*> devices;
  std::vector<std::string> node_names;
};

// Every way to place ranks within the bounds, in order of preference: most devices first, then fewest
// nodes. Each node takes the same number of ranks (as torchrun's --nproc-per-node and Slurm's
// --ntasks-per-node do), its roomiest devices; of the nodes that can, those whose roomiest devices
// are roomiest. `devices` is sorted roomiest first.
std::vector<Layout> LayoutsByPreference(const std::vector<const DeviceCapacity*>& devices, int min_devices, int max_devices,
                                        int min_nodes, int max_nodes) {
  std::vector<std::string> node_order;
  std::map<std::string, std::vector<const DeviceCapacity*>> by_node;  // each roomiest first (devices is)
  for (const DeviceCapacity* device : devices) {
    auto [it, inserted] = by_node.try_emplace(device->node);
    if (inserted) node_order.push_back(device->node);
    it->second.push_back(device);
  }
  const int node_count = static_cast<int>(node_order.size());
  std::vector<Layout> layouts;
  for (int n = std::min(max_devices, static_cast<int>(devices.size())); n >= min_devices; --n) {
    for (int k = min_nodes; k <= std::min({max_nodes, node_count, n}); ++k) {
      if (n % k != 0) continue;
      const int d = n / k;
      std::vector<std::string> eligible;
      for (const std::string& node : node_order) {
        if (static_cast<int>(by_node[node].size()) >= d) eligible.push_back(node);
      }
      if (static_cast<int>(eligible.size()) < k) continue;
      // The k nodes whose d-th roomiest device is roomiest, kept in the order the inventory lists them.
      std::vector<std::string> ranked = eligible;
      std::stable_sort(ranked.begin(), ranked.end(), [&](const std::string& a, const std::string& b) {
        return by_node[a][d - 1]->free_bytes > by_node[b][d - 1]->free_bytes;
      });
      ranked.resize(k);
      Layout layout;
      layout.nodes = k;
      layout.per_node = d;
      for (const std::string& node : eligible) {
        if (std::find(ranked.begin(), ranked.end(), node) == ranked.end()) continue;
        layout.node_names.push_back(node);
        layout.devices.insert(layout.devices.end(), by_node[node].begin(), by_node[node].begin() + d);
      }
      layouts.push_back(std::move(layout));
    }
  }
  return layouts;
}

// "4 devices" on one machine, "4 devices (2 nodes x 2)" on a cluster.
std::string DescribeLayout(const Layout& layout, bool cluster) {
  std::string out = absl::StrCat(layout.devices.size(), " devices");
  if (cluster) absl::StrAppend(&out, " (", layout.nodes, " node", layout.nodes == 1 ? "" : "s", " x ", layout.per_node, ")");
  return out;
}

// How a rank trains: the model's profile (its activations kept, or recomputed in backward) and
// whether the optimizer states are sharded over the ranks.
struct Strategy {
  const ModelProfile* model = nullptr;
  bool sharded = false;
};

// "optimizer states sharded over 2 ranks", "activations recomputed, optimizer states whole"; whether
// activations are kept is said only where recomputing them was a choice.
std::string DescribeStrategy(const Strategy& strategy, int ranks, bool recomputing_was_a_choice) {
  std::string out;
  if (strategy.model->activation_checkpointing) {
    out = "activations recomputed, ";
  } else if (recomputing_was_a_choice) {
    out = "activations kept, ";
  }
  absl::StrAppend(&out, strategy.sharded ? absl::StrCat("optimizer states sharded over ", ranks, " ranks")
                                         : "optimizer states whole");
  return out;
}

// The seconds of one step at `batch` on measured step times (sorted, two or more): between two
// measured micro-batches on the line through them, beyond them along the nearest segment, at least 0.
double StepSecondsAt(const std::vector<MeasuredStepTime>& times, int64_t batch) {
  size_t i = 1;
  while (i + 1 < times.size() && times[i].batch < batch) ++i;
  const MeasuredStepTime& a = times[i - 1];
  const MeasuredStepTime& b = times[i];
  const double slope = (b.seconds - a.seconds) / static_cast<double>(b.batch - a.batch);
  return std::max(0.0, a.seconds + slope * static_cast<double>(batch - a.batch));
}

// How long one optimizer step of a rank takes with `strategy_model` at `batch`, comparably across the
// strategies of one plan. Where the probe timed the spec's own model (`model`) at two or more
// micro-batches, in seconds: passes x the measured step time at the batch, the recomputing model's
// own where it was timed, else the kept model's with recompute_share more of its batch-dependent
// part. Otherwise in samples' compute: passes x batch x (1 + recompute_share where recomputed), a
// pass costing nothing beyond its samples. Sharding changes neither. Recomputing does the kept
// model's work and a forward more, so at one micro-batch it is never taken as the faster: timings
// that say so are the probe's noise or a line extended past its points (a GPU plan's recomputing
// steps came out 1.9x faster at micro-batch 128 on CPU timings up to 32).
double PredictedStepTime(int64_t per_rank, int64_t batch, const ModelProfile& strategy_model, const ModelProfile& model) {
  const double passes = static_cast<double>(per_rank / batch);
  const double recomputed = strategy_model.activation_checkpointing && !model.activation_checkpointing ? model.recompute_share : 0.0;
  if (model.step_times.size() < 2) return passes * static_cast<double>(batch) * (1.0 + recomputed);
  const double seconds = StepSecondsAt(model.step_times, batch);
  if (strategy_model.step_times.size() >= 2) {
    const double own = StepSecondsAt(strategy_model.step_times, batch);
    return passes * (recomputed > 0 ? std::max(own, seconds) : own);
  }
  const double per_pass = StepSecondsAt(model.step_times, 0);
  return passes * (seconds + recomputed * (seconds - per_pass));
}

std::string DescribeStepTimes(const std::vector<MeasuredStepTime>& times) {
  std::vector<std::string> points;
  for (const MeasuredStepTime& t : times) points.push_back(absl::StrFormat("%d: %.3f s", t.batch, t.seconds));
  return absl::StrJoin(points, ", ");
}

std::string StepTimeModelText(const ModelProfile& model) {
  if (model.step_times.size() < 2) {
    return absl::StrFormat("step time not measured: taken as passes x batch x (1 + %.2f where activations are "
                           "recomputed) samples' compute",
                           model.recompute_share);
  }
  std::string out = absl::StrCat("step time from the probe's timed steps, by micro-batch (",
                                 DescribeStepTimes(model.step_times), ")");
  if (model.recomputing != nullptr) {
    absl::StrAppend(&out, model.recomputing->step_times.size() >= 2
                              ? absl::StrCat("; recomputing (", DescribeStepTimes(model.recomputing->step_times), ")")
                              : absl::StrFormat("; recomputing adds %.2f of the batch's part", model.recompute_share));
  }
  return out;
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
  const auto& resources = spec.resources();
  const int min_devices = std::max(1, resources.min_devices());
  int max_devices = resources.max_devices() > 0 ? resources.max_devices() : static_cast<int>(devices.size());
  if (limits.max_devices >= 0) {
    if (limits.max_devices < min_devices) {
      return absl::UnavailableError(absl::StrCat("needs ", min_devices, " device(s) (spec.resources.min_devices), but ",
                                                 limits.max_devices_reason));
    }
    max_devices = std::min(max_devices, limits.max_devices);
  }
  const double headroom = resources.memory_headroom();

  const bool cluster = std::any_of(devices.begin(), devices.end(), [](const DeviceCapacity& d) { return !d.node.empty(); });
  const int min_nodes = std::max(1, resources.min_nodes());
  int max_nodes = resources.max_nodes() > 0 ? resources.max_nodes() : std::numeric_limits<int>::max();
  if (limits.max_nodes > 0) {
    if (min_nodes > limits.max_nodes) {
      return absl::FailedPreconditionError(absl::StrCat("spec.resources.min_nodes: ", min_nodes, " nodes, but ",
                                                        limits.max_nodes_reason));
    }
    max_nodes = std::min(max_nodes, limits.max_nodes);
  }

  if (static_cast<int>(devices.size()) < min_devices) {
    return absl::UnavailableError(absl::StrCat("needs ", min_devices, " free device(s) (spec.resources.min_devices), ",
                                               devices.size(), " free now"));
  }
  // A script's dataset is its own (train_samples 0): its epochs are its business.
  if (model.train_samples > 0 && model.train_samples < global_batch) {
    return absl::InvalidArgumentError(absl::StrCat("spec.global_batch_size: ", global_batch,
                                                   " is larger than the dataset's ", model.train_samples,
                                                   " training samples; use at most that"));
  }

  // The roomiest devices first, so n devices means the n with the most memory.
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
  // A script brings its own PyTorch, whose Gloo carries CUDA tensors between ranks on one GPU; the
  // built-in worker has no backend for them.
  if (!spec.has_script()) {
    // One rank per GPU: of a GPU's slices, its roomiest.
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
  }
  const std::vector<Layout> layouts = LayoutsByPreference(sorted, min_devices, max_devices, min_nodes, max_nodes);
  if (layouts.empty()) {
    return absl::UnavailableError(absl::StrCat("needs ", min_devices, " free device(s) on ", min_nodes,
                                               " node(s) or more with the same number free on each "
                                               "(spec.resources.min_devices, min_nodes), ",
                                               devices.size(), " free now"));
  }

  std::vector<std::string> rejected;  // why larger device counts were not chosen
  for (const Layout& layout : layouts) {
    const int n = static_cast<int>(layout.devices.size());
    const std::string described = DescribeLayout(layout, cluster);
    if (global_batch % n != 0) {
      rejected.push_back(absl::StrCat(described, ": global batch ", global_batch, " does not split evenly"));
      continue;
    }
    const int64_t per_rank = global_batch / n;
    const DeviceCapacity& tightest = **std::min_element(
        layout.devices.begin(), layout.devices.end(),
        [](const DeviceCapacity* a, const DeviceCapacity* b) { return a->free_bytes < b->free_bytes; });
    const int64_t free_bytes = tightest.free_bytes;
    const int64_t budget = static_cast<int64_t>(static_cast<double>(free_bytes) * (1.0 - headroom));
    const DeviceCosts& costs = tightest.costs;
    // Optimizer states sharded over the n ranks (ZeRO stage 1) where the spec allows it: a built-in
    // job of several ranks, unless spec.ddp.zero_stage is 0; a script's only where the spec pins it (its
    // one-rank probe cannot see what sharding saves, so the plan counts every state on every rank).
    const bool pinned_shard = spec.ddp().has_zero_stage() && spec.ddp().zero_stage() == 1;
    const bool may_shard = n > 1 && (spec.has_script() ? pinned_shard
                                                       : !(spec.ddp().has_zero_stage() && spec.ddp().zero_stage() == 0));
    const bool must_shard = may_shard && pinned_shard;
    // How a rank may train: its model as the spec has it, or recomputing its blocks' activations in
    // backward where the spec leaves that to the plan (the profile's alternative); optimizer states
    // whole or sharded. Listed in order of preference at equal predicted step time.
    std::vector<Strategy> strategies;
    for (const ModelProfile* m : {&model, model.recomputing.get()}) {
      if (m == nullptr) continue;
      if (!must_shard) strategies.push_back({m, false});
      if (may_shard) strategies.push_back({m, true});
    }
    const auto estimate_with = [&](const Strategy& strategy, int64_t b) {
      // A script's share is not known (its probe held every state): it is planned holding them all.
      return EstimateRankMemory(*strategy.model, spec, b, estimator, costs,
                                strategy.sharded && !spec.has_script() ? n : 1);
    };
    const auto fits = [&](const Strategy& strategy, int64_t b) {
      // Nothing measured: its run measures it (ModelProfile::memory_unmeasured).
      if (strategy.model->Unmeasured()) return true;
      return ChargedBytes(estimate_with(strategy, b), costs) <= budget;
    };
    // The largest allowed divisor of the per-rank batch that fits the strategy (0: none).
    const auto largest_fitting = [&](const Strategy& strategy) -> int64_t {
      for (int64_t b : DivisorsDescending(per_rank)) {
        const int64_t bound = limits.MaxPerDeviceBatch(strategy.model->activation_checkpointing);
        if (bound > 0 && b > bound) continue;
        if (fits(strategy, b)) return b;
      }
      return 0;
    };

    Strategy strategy = strategies.front();
    int64_t chosen = 0;
    std::vector<std::string> weighed;  // the other strategies that fit, with their predicted step time
    if (resources.per_device_batch() == 0 && !model.batch_not_plannable.empty()) {
      return absl::FailedPreconditionError(model.batch_not_plannable);
    }
    if (resources.per_device_batch() > 0) {
      const int64_t fixed = resources.per_device_batch();
      if (per_rank % fixed != 0) {
        rejected.push_back(absl::StrCat(described, ": ", per_rank, " samples per device per step is not a multiple of ",
                                        "spec.resources.per_device_batch ", fixed));
        continue;
      }
      // A fixed batch is the user's call: it is planned even when predicted not to fit, and says so;
      // a strategy other than the spec's own is taken when only it fits.
      chosen = fixed;
      for (const Strategy& s : strategies) {
        if (!fits(s, fixed)) continue;
        strategy = s;
        break;
      }
    } else {
      struct Candidate {
        Strategy strategy;
        int64_t batch = 0;
        double step_time = 0;
      };
      std::vector<Candidate> candidates;
      for (const Strategy& s : strategies) {
        const int64_t b = largest_fitting(s);
        if (b > 0) candidates.push_back({s, b, PredictedStepTime(per_rank, b, *s.model, model)});
      }
      if (candidates.empty()) {
        const Strategy& roomiest = strategies.back();
        const int64_t bound = limits.MaxPerDeviceBatch(roomiest.model->activation_checkpointing);
        if (bound > 0 && bound < per_rank && fits(roomiest, 1)) {
          rejected.push_back(absl::StrCat(described, ": no divisor of the ", per_rank,
                                          " samples per device per step is at most ", bound,
                                          ", the largest batch below the one that ran out of memory"));
          continue;
        }
        std::string alternatives;
        for (size_t i = 1; i < strategies.size(); ++i) {
          absl::StrAppend(&alternatives, i == 1 ? " (" : "; ", FormatBytes(ChargedBytes(estimate_with(strategies[i], 1), costs)),
                          " with ", DescribeStrategy(strategies[i], n, model.recomputing != nullptr));
          if (i + 1 == strategies.size()) absl::StrAppend(&alternatives, ")");
        }
        rejected.push_back(absl::StrCat(described, ": even per-device batch 1 needs ",
                                        FormatBytes(ChargedBytes(estimate_with(strategies.front(), 1), costs)),
                                        alternatives, ", more than the ", FormatBytes(budget), " usable on ", tightest.id));
        continue;
      }
      // The fastest predicted; at equal time the larger batch (fewer passes), then the earlier strategy.
      const Candidate* best = &candidates.front();
      for (const Candidate& c : candidates) {
        if (c.step_time < best->step_time - 1e-9 || (std::abs(c.step_time - best->step_time) <= 1e-9 && c.batch > best->batch)) {
          best = &c;
        }
      }
      strategy = best->strategy;
      chosen = best->batch;
      if (candidates.size() > 1) {
        // Where the probe timed the steps, a step time is seconds: the job's samples a second.
        const bool timed = model.step_times.size() >= 2;
        const auto samples_per_second = [&](const Candidate& c) {
          return timed && c.step_time > 0 ? absl::StrFormat("%.1f samples/s", global_batch / c.step_time) : "";
        };
        if (timed) weighed.push_back(absl::StrCat(samples_per_second(*best), " predicted"));
        for (const Candidate& c : candidates) {
          if (&c == best) continue;
          weighed.push_back(absl::StrFormat(
              "%s at per-device batch %d (%d passes, predicted peak %s): %.2fx the step time%s",
              DescribeStrategy(c.strategy, n, model.recomputing != nullptr), c.batch, per_rank / c.batch,
              FormatBytes(ChargedBytes(estimate_with(c.strategy, c.batch), costs)), c.step_time / best->step_time,
              timed ? absl::StrCat(", ", samples_per_second(c)) : ""));
        }
      }
    }
    const ModelProfile& chosen_model = *strategy.model;
    const bool sharded = strategy.sharded;
    fitrun::v1::MemoryBreakdown predicted =
        chosen_model.Unmeasured() ? fitrun::v1::MemoryBreakdown() : estimate_with(strategy, chosen);
    // Why the strategy, beside the batch: what the spec says, or what the others would have given.
    std::string why_sharding = must_shard ? "spec.ddp.zero_stage is 1" : "";
    if (sharded && !must_shard) {
      const Strategy whole{strategy.model, false};
      const int64_t whole_batch = resources.per_device_batch() > 0 ? 0 : largest_fitting(whole);
      why_sharding =
          resources.per_device_batch() > 0
              ? absl::StrCat("the fixed per-device batch fits only with them (",
                             FormatBytes(ChargedBytes(estimate_with(whole, chosen), costs)), " unsharded)")
          : whole_batch == 0 ? absl::StrCat("without them even per-device batch 1 needs ",
                                            FormatBytes(ChargedBytes(estimate_with(whole, 1), costs)))
                             : absl::StrCat("they fit per-device batch ", chosen, " where keeping every state "
                                            "on every rank fits ", whole_batch, " (", per_rank / chosen, " instead of ",
                                            per_rank / whole_batch, " accumulation passes)");
    }

    Plan plan;
    for (const DeviceCapacity* device : layout.devices) plan.add_device_ids(device->id);
    if (cluster) {
      for (const std::string& node : layout.node_names) plan.add_nodes(node);
      plan.set_devices_per_node(layout.per_node);
    }
    if (costs.any() && !chosen_model.Unmeasured()) {
      // The reserve the allocator keeps grows only up to what the device leaves it.
      FitReserveToLimit(predicted, costs.capacity_binds_allocator_only
                                       ? free_bytes
                                       : free_bytes - costs.outside_allocator_bytes());
    }
    plan.set_per_device_batch(chosen);
    plan.set_zero_stage(sharded ? 1 : 0);
    plan.set_activation_checkpointing(chosen_model.activation_checkpointing);
    plan.set_grad_accum_steps(static_cast<int32_t>(per_rank / chosen));
    plan.set_learning_rate(ScaledLearningRate(spec.optimizer(), global_batch));
    *plan.mutable_predicted() = predicted;
    plan.set_usable_bytes(budget);
    plan.set_steps_per_epoch(model.train_samples / global_batch);
    plan.set_total_steps(spec.max_steps() > 0 ? spec.max_steps()
                                              : static_cast<int64_t>(spec.epochs()) * plan.steps_per_epoch());

    std::string why_devices = absl::StrCat("devices: ", n, " (", sorted.size(), " free, spec allows ", min_devices, "..",
                                           resources.max_devices() > 0 ? absl::StrCat(resources.max_devices()) : "any",
                                           "); more devices means more samples per second");
    if (cluster) {
      absl::StrAppend(&why_devices, "; nodes: ", layout.nodes, " x ", layout.per_node, " devices (",
                      absl::StrJoin(layout.node_names, ", "), "), the fewest nodes that hold them: ranks on one node "
                      "talk faster than across nodes");
      if (limits.max_nodes > 0 && !limits.max_nodes_reason.empty()) {
        absl::StrAppend(&why_devices, "; at most ", limits.max_nodes, " node(s): ", limits.max_nodes_reason);
      }
    }
    if (limits.max_devices >= 0 && n == limits.max_devices && n < static_cast<int>(sorted.size())) {
      absl::StrAppend(&why_devices, "; at most ", limits.max_devices, " now: ", limits.max_devices_reason);
    }
    for (const std::string& r : rejected) absl::StrAppend(&why_devices, "; not ", r);
    plan.add_reasons(why_devices);

    if (chosen_model.Unmeasured()) {
      plan.add_reasons(absl::StrCat(
          "per_device_batch: ", chosen,
          resources.per_device_batch() > 0
              ? " fixed by spec.resources.per_device_batch"
              : absl::StrCat(", the largest divisor of the ", per_rank, " samples each device takes per step",
                             limits.MaxPerDeviceBatch(chosen_model.activation_checkpointing) > 0
                                 ? absl::StrCat(" up to ", limits.MaxPerDeviceBatch(chosen_model.activation_checkpointing))
                                 : ""),
          "; no peak is predicted: nothing has measured the script yet, so it runs with the device's memory (",
          FormatBytes(budget), " usable on ", tightest.id, ") and its first steps measure its peak"));
    } else if (resources.per_device_batch() > 0) {
      plan.add_reasons(absl::StrCat("per_device_batch: ", chosen, " fixed by spec.resources.per_device_batch; predicted peak ",
                                    FormatBytes(ChargedBytes(predicted, costs)), " against ", FormatBytes(budget), " usable",
                                    ChargedBytes(predicted, costs) > budget ? " (PREDICTED NOT TO FIT)" : "",
                                    chosen_model.measured.has_value()
                                        ? absl::StrCat("; its peak is ", chosen_model.measured->HowEstimated(chosen))
                                        : ""));
    } else {
      std::string why_batch = absl::StrCat("per_device_batch: ", chosen, ", the largest divisor of the ", per_rank,
                                           " samples each device takes per step whose predicted peak (",
                                           FormatBytes(ChargedBytes(predicted, costs)), ") fits the ", FormatBytes(budget),
                                           " usable on ", tightest.id, " (", FormatBytes(free_bytes), " free less ",
                                           absl::StrFormat("%.0f%%", headroom * 100), " headroom)");
      if (chosen_model.measured.has_value()) {
        absl::StrAppend(&why_batch, "; its peak is ", chosen_model.measured->HowEstimated(chosen));
      }
      if (limits.MaxPerDeviceBatch(chosen_model.activation_checkpointing) > 0) {
        absl::StrAppend(&why_batch, "; at most ", limits.MaxPerDeviceBatch(chosen_model.activation_checkpointing),
                        " because a larger batch ran out of memory in an earlier attempt");
      }
      plan.add_reasons(why_batch);
    }
    if (sharded && spec.has_script()) {
      plan.add_reasons(absl::StrCat("zero_stage: 1, optimizer states sharded over the ", n, " ranks, because ",
                                    why_sharding, "; the script shards them (FITRUN_ZERO_STAGE=1); its probe ran "
                                    "one rank, so the predicted peak keeps every state on every rank"));
    } else if (sharded) {
      plan.add_reasons(absl::StrCat("zero_stage: 1, optimizer states sharded over the ", n, " ranks (",
                                    FormatBytes(predicted.optimizer_state_bytes()), " per rank), because ", why_sharding,
                                    "; each rank steps its share and broadcasts it after the step"));
    }
    if (chosen_model.activation_checkpointing) {
      const Strategy kept{&model, sharded};
      std::string why = "it is predicted the fastest way to train (see strategy)";
      if (model.recomputing == nullptr) {
        why = spec.has_script() ? "spec.script.activation_checkpointing is true" : "the spec's model config sets it";
      } else if (resources.per_device_batch() > 0) {
        why = "the fixed per-device batch fits only so";
      } else if (largest_fitting(kept) == 0) {
        why = absl::StrCat("without it even per-device batch 1 needs ", FormatBytes(ChargedBytes(estimate_with(kept, 1), costs)));
      }
      plan.add_reasons(absl::StrCat("activation_checkpointing: each block's activations recomputed in backward (",
                                    FormatBytes(predicted.activations_bytes()), " of activations at this batch), because ",
                                    why, spec.has_script() ? "; the script recomputes them (FITRUN_ACTIVATION_CHECKPOINTING=1)" : ""));
    }
    if (!weighed.empty()) {
      plan.add_reasons(absl::StrCat("strategy: ", DescribeStrategy(strategy, n, model.recomputing != nullptr), ", predicted the fastest of those that fit (",
                                    absl::StrJoin(weighed, "; "), "); ", StepTimeModelText(model)));
    }
    plan.add_reasons(absl::StrCat("grad_accum_steps: ", plan.grad_accum_steps(), " so that ", n, " x ", chosen, " x ",
                                  plan.grad_accum_steps(), " = global batch ", global_batch));
    if (spec.has_script() && plan.grad_accum_steps() > 1) {
      plan.add_reasons(absl::StrCat(
          "the script must accumulate gradients over ", plan.grad_accum_steps(),
          " micro-batches per optimizer step (FITRUN_GRAD_ACCUM_STEPS",
          spec.script().grad_accum_flag().empty() ? "" : absl::StrCat(", or ", spec.script().grad_accum_flag()),
          "); one that does not trains on a global batch of ", n * chosen,
          spec.script().grad_accum_flag().empty() ? " (spec.script.grad_accum_flag passes it as a flag)" : ""));
    }
    if (!chosen_model.memory_source.empty()) {
      plan.add_reasons(absl::StrCat("memory estimate: ", chosen_model.memory_source));
    }
    if (costs.any() && chosen_model.Unmeasured()) {
      plan.set_cuda_allocator_config(costs.allocator_config);
    } else if (costs.any()) {
      plan.set_cuda_allocator_config(costs.allocator_config);
      plan.add_reasons(absl::StrCat(
          "device memory beyond the tensors: the caching allocator's reserve ",
          FormatBytes(predicted.allocator_reserve_bytes()),
          absl::StrFormat(" (it keeps up to %.2fx what it hands out where memory allows, needs %.2fx to train; "
                          "PYTORCH_CUDA_ALLOC_CONF=%s)",
                          costs.reserve_ratio, costs.needed_ratio,
                          costs.allocator_config.empty() ? "unset" : costs.allocator_config),
          ", the CUDA context ", FormatBytes(predicted.cuda_context_bytes()), ", the libraries' workspaces ",
          FormatBytes(predicted.library_workspace_bytes()), ", the collectives' buffers ",
          FormatBytes(predicted.communication_bytes()),
          costs.capacity_binds_allocator_only
              ? absl::StrCat("; the slice's cap binds the allocator alone, the rest lies outside it")
              : "",
          "; from ", costs.source));
    }
    plan.add_reasons(absl::StrFormat("learning_rate: %g (spec lr %g, lr_scaling %s against reference batch %d)",
                                     plan.learning_rate(), spec.optimizer().lr(),
                                     ScalingName(spec.optimizer().lr_scaling()),
                                     spec.optimizer().reference_batch_size() > 0
                                         ? spec.optimizer().reference_batch_size()
                                         : global_batch));
    return plan;
  }

  std::string message = "no plan fits";
  for (const std::string& r : rejected) absl::StrAppend(&message, "; ", r);
  if (resources.per_device_batch() > 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.resources.per_device_batch: ", message,
                                                   "; choose a per-device batch that divides global_batch_size / devices"));
  }
  if (std::all_of(rejected.begin(), rejected.end(),
                  [](const std::string& r) { return r.find("does not split evenly") != std::string::npos; })) {
    absl::StrAppend(&message, "; a global batch divisible by the device count would");
    return absl::ResourceExhaustedError(message);
  }
  absl::StrAppend(&message, WhatWouldFit(spec, model, sorted, estimator, headroom, min_devices));
  absl::StrAppend(&message, "; or a smaller model");
  return absl::ResourceExhaustedError(message);
}

}  // namespace fitrun::server
