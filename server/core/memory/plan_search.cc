#include "server/core/memory/plan_search.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

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

std::string DescribeStepTimes(const std::vector<MeasuredStepTime>& times) {
  std::vector<std::string> points;
  for (const MeasuredStepTime& t : times) points.push_back(absl::StrFormat("%d: %.3f s", t.batch, t.seconds));
  return absl::StrJoin(points, ", ");
}

}  // namespace

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

std::string DescribeLayout(const Layout& layout, bool cluster) {
  std::string out = absl::StrCat(layout.devices.size(), " devices");
  if (cluster) absl::StrAppend(&out, " (", layout.nodes, " node", layout.nodes == 1 ? "" : "s", " x ", layout.per_node, ")");
  return out;
}

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


RankBudget BudgetOf(const Layout& layout, int64_t global_batch, double headroom) {
  RankBudget budget;
  budget.ranks = static_cast<int>(layout.devices.size());
  budget.per_rank = global_batch / budget.ranks;
  budget.tightest = *std::min_element(
      layout.devices.begin(), layout.devices.end(),
      [](const DeviceCapacity* a, const DeviceCapacity* b) { return a->free_bytes < b->free_bytes; });
  budget.free_bytes = budget.tightest->free_bytes;
  budget.usable_bytes = static_cast<int64_t>(static_cast<double>(budget.free_bytes) * (1.0 - headroom));
  budget.headroom = headroom;
  return budget;
}

std::vector<Strategy> StrategiesFor(const fitrun::v1::JobSpec& spec, const ModelProfile& model, int ranks) {
  const bool pinned_shard = spec.ddp().has_zero_stage() && spec.ddp().zero_stage() == 1;
  const bool may_shard =
      ranks > 1 && (spec.has_script() ? pinned_shard : !(spec.ddp().has_zero_stage() && spec.ddp().zero_stage() == 0));
  const bool must_shard = may_shard && pinned_shard;
  std::vector<Strategy> strategies;
  for (const ModelProfile* m : {&model, model.recomputing.get()}) {
    if (m == nullptr) continue;
    if (!must_shard) strategies.push_back({m, false});
    if (may_shard) strategies.push_back({m, true});
  }
  return strategies;
}

fitrun::v1::MemoryBreakdown RankEstimate::Breakdown(const Strategy& strategy, int64_t batch) const {
  return EstimateRankMemory(*strategy.model, spec_, batch, estimator_, costs(),
                            strategy.sharded && !spec_.has_script() ? budget_.ranks : 1);
}

int64_t RankEstimate::Charged(const Strategy& strategy, int64_t batch) const {
  return ChargedBytes(Breakdown(strategy, batch), costs());
}

bool RankEstimate::Fits(const Strategy& strategy, int64_t batch) const {
  return strategy.model->Unmeasured() || Charged(strategy, batch) <= budget_.usable_bytes;
}

int64_t RankEstimate::LargestFitting(const Strategy& strategy, const PlanLimits& limits) const {
  const int64_t bound = limits.MaxPerDeviceBatch(strategy.model->activation_checkpointing);
  for (int64_t b : DivisorsDescending(budget_.per_rank)) {
    if (bound > 0 && b > bound) continue;
    if (Fits(strategy, b)) return b;
  }
  return 0;
}

namespace {

// A fixed per-device batch is the user's call: planned even when predicted not to fit (the reasons
// say so); a strategy other than the spec's own is taken when only it fits.
BatchChoice ChooseFixedBatch(const fitrun::v1::JobSpec& spec, const std::vector<Strategy>& strategies,
                             const RankEstimate& estimate, const std::string& described_layout) {
  BatchChoice choice;
  choice.strategy = strategies.front();
  const int64_t fixed = spec.resources().per_device_batch();
  const int64_t per_rank = estimate.budget().per_rank;
  if (per_rank % fixed != 0) {
    choice.rejected = absl::StrCat(described_layout, ": ", per_rank, " samples per device per step is not a multiple of ",
                                   "spec.resources.per_device_batch ", fixed);
    return choice;
  }
  choice.batch = fixed;
  for (const Strategy& s : strategies) {
    if (!estimate.Fits(s, fixed)) continue;
    choice.strategy = s;
    break;
  }
  return choice;
}

// Why no strategy fits any batch on the layout: what batch 1 needs with each, or that the bound an
// out-of-memory error left has no divisor below it.
std::string NothingFits(const ModelProfile& model, const std::vector<Strategy>& strategies, const RankEstimate& estimate,
                        const PlanLimits& limits, const std::string& described_layout) {
  const RankBudget& budget = estimate.budget();
  const Strategy& roomiest = strategies.back();
  const int64_t bound = limits.MaxPerDeviceBatch(roomiest.model->activation_checkpointing);
  if (bound > 0 && bound < budget.per_rank && estimate.Fits(roomiest, 1)) {
    return absl::StrCat(described_layout, ": no divisor of the ", budget.per_rank,
                        " samples per device per step is at most ", bound,
                        ", the largest batch below the one that ran out of memory");
  }
  std::string alternatives;
  for (size_t i = 1; i < strategies.size(); ++i) {
    absl::StrAppend(&alternatives, i == 1 ? " (" : "; ", FormatBytes(estimate.Charged(strategies[i], 1)), " with ",
                    DescribeStrategy(strategies[i], budget.ranks, model.recomputing != nullptr));
    if (i + 1 == strategies.size()) absl::StrAppend(&alternatives, ")");
  }
  return absl::StrCat(described_layout, ": even per-device batch 1 needs ",
                      FormatBytes(estimate.Charged(strategies.front(), 1)), alternatives, ", more than the ",
                      FormatBytes(budget.usable_bytes), " usable on ", budget.tightest->id);
}

}  // namespace

BatchChoice ChooseBatch(const fitrun::v1::JobSpec& spec, const ModelProfile& model,
                        const std::vector<Strategy>& strategies, const RankEstimate& estimate,
                        const PlanLimits& limits, const std::string& described_layout) {
  if (spec.resources().per_device_batch() > 0) return ChooseFixedBatch(spec, strategies, estimate, described_layout);
  struct Candidate {
    Strategy strategy;
    int64_t batch = 0;
    double step_time = 0;
  };
  const int64_t per_rank = estimate.budget().per_rank;
  std::vector<Candidate> candidates;
  for (const Strategy& s : strategies) {
    const int64_t b = estimate.LargestFitting(s, limits);
    if (b > 0) candidates.push_back({s, b, PredictedStepTime(per_rank, b, *s.model, model)});
  }
  BatchChoice choice;
  if (candidates.empty()) {
    choice.strategy = strategies.front();
    choice.rejected = NothingFits(model, strategies, estimate, limits, described_layout);
    return choice;
  }
  // The fastest predicted; at equal time the larger batch (fewer passes), then the earlier strategy.
  const Candidate* best = &candidates.front();
  for (const Candidate& c : candidates) {
    if (c.step_time < best->step_time - 1e-9 || (std::abs(c.step_time - best->step_time) <= 1e-9 && c.batch > best->batch)) {
      best = &c;
    }
  }
  choice.strategy = best->strategy;
  choice.batch = best->batch;
  if (candidates.size() < 2) return choice;
  // Where the probe timed the steps, a step time is seconds: the job's samples a second.
  const bool timed = model.step_times.size() >= 2;
  const int64_t global_batch = spec.global_batch_size();
  const auto samples_per_second = [&](const Candidate& c) {
    return timed && c.step_time > 0 ? absl::StrFormat("%.1f samples/s", global_batch / c.step_time) : "";
  };
  if (timed) choice.weighed.push_back(absl::StrCat(samples_per_second(*best), " predicted"));
  for (const Candidate& c : candidates) {
    if (&c == best) continue;
    choice.weighed.push_back(absl::StrFormat(
        "%s at per-device batch %d (%d passes, predicted peak %s): %.2fx the step time%s",
        DescribeStrategy(c.strategy, estimate.budget().ranks, model.recomputing != nullptr), c.batch, per_rank / c.batch,
        FormatBytes(estimate.Charged(c.strategy, c.batch)), c.step_time / best->step_time,
        timed ? absl::StrCat(", ", samples_per_second(c)) : ""));
  }
  return choice;
}

}  // namespace fitrun::server
