// The planner's search, step by step (planner.h puts them together): which ways to place the ranks
// there are (layouts), what a rank of one layout may spend (its budget), how it may train
// (strategies: activations kept or recomputed, optimizer states whole or sharded), and which
// per-device batch and strategy a layout gets. Pure functions of their inputs.
#ifndef FITRUN_SERVER_CORE_MEMORY_PLAN_SEARCH_H_
#define FITRUN_SERVER_CORE_MEMORY_PLAN_SEARCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fitrun/v1/job.pb.h"
#include "server/core/memory/estimator.h"
#include "server/core/memory/model_profile.h"
#include "server/core/memory/planner.h"

namespace fitrun::server {

// Divisors of n, largest first.
std::vector<int64_t> DivisorsDescending(int64_t n);

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
std::vector<Layout> LayoutsByPreference(const std::vector<const DeviceCapacity*>& devices, int min_devices,
                                        int max_devices, int min_nodes, int max_nodes);

// "4 devices" on one machine, "4 devices (2 nodes x 2)" on a cluster.
std::string DescribeLayout(const Layout& layout, bool cluster);

// How a rank trains: the model's profile (its activations kept, or recomputed in backward) and
// whether the optimizer states are sharded over the ranks.
struct Strategy {
  const ModelProfile* model = nullptr;
  bool sharded = false;
};

// "optimizer states sharded over 2 ranks", "activations recomputed, optimizer states whole"; whether
// activations are kept is said only where recomputing them was a choice.
std::string DescribeStrategy(const Strategy& strategy, int ranks, bool recomputing_was_a_choice);

// What a rank of one layout trains against: the tightest of its devices, less the spec's headroom.
struct RankBudget {
  int ranks = 0;
  int64_t per_rank = 0;  // samples a rank takes per optimizer step
  const DeviceCapacity* tightest = nullptr;
  int64_t free_bytes = 0;
  int64_t usable_bytes = 0;
  double headroom = 0;
};
RankBudget BudgetOf(const Layout& layout, int64_t global_batch, double headroom);

// The strategies a rank of `ranks` may train with, in order of preference at equal predicted step
// time. Optimizer states are sharded (ZeRO stage 1) where the spec allows it: a built-in job of
// several ranks, unless spec.ddp.zero_stage is 0; a script's only where the spec pins it (its one-rank
// probe cannot see what sharding saves). Recomputing activations where the profile has the
// alternative.
std::vector<Strategy> StrategiesFor(const fitrun::v1::JobSpec& spec, const ModelProfile& model, int ranks);

// A rank's predicted peak under one strategy and batch, held against the budget.
class RankEstimate {
 public:
  RankEstimate(const fitrun::v1::JobSpec& spec, const EstimatorOptions& estimator, const RankBudget& budget)
      : spec_(spec), estimator_(estimator), budget_(budget) {}

  // The breakdown; a script's share of sharded states is not known (its probe held every state), so
  // it is planned holding them all.
  fitrun::v1::MemoryBreakdown Breakdown(const Strategy& strategy, int64_t batch) const;
  // What the device's capacity is held against (estimator.h's ChargedBytes).
  int64_t Charged(const Strategy& strategy, int64_t batch) const;
  // A model nothing has measured fits anything: its run measures it (ModelProfile::memory_unmeasured).
  bool Fits(const Strategy& strategy, int64_t batch) const;
  // The largest divisor of the per-rank batch within `limits` that fits (0: none).
  int64_t LargestFitting(const Strategy& strategy, const PlanLimits& limits) const;
  const DeviceCosts& costs() const { return budget_.tightest->costs; }
  const RankBudget& budget() const { return budget_; }

 private:
  const fitrun::v1::JobSpec& spec_;
  const EstimatorOptions& estimator_;
  const RankBudget& budget_;
};

// How long one optimizer step of a rank takes with `strategy_model` at `batch`, comparably across the
// strategies of one plan. Where the probe timed the spec's own model (`model`) at two or more
// micro-batches, in seconds: passes x the measured step time at the batch, the recomputing model's
// own where it was timed, else the kept model's with recompute_share more of its batch-dependent
// part. Otherwise in samples' compute: passes x batch x (1 + recompute_share where recomputed), a
// pass costing nothing beyond its samples. Sharding changes neither. Recomputing does the kept
// model's work and a forward more, so at one micro-batch it is never taken as the faster: timings
// that say so are the probe's noise or a line extended past its points (a GPU plan's recomputing
// steps came out 1.9x faster at micro-batch 128 on CPU timings up to 32).
double PredictedStepTime(int64_t per_rank, int64_t batch, const ModelProfile& strategy_model, const ModelProfile& model);

// Where the step times came from, for the plan's reasons.
std::string StepTimeModelText(const ModelProfile& model);

// One layout's per-device batch and strategy: for a fixed batch the spec's own strategy unless only
// another fits; otherwise each strategy's largest fitting batch, the fastest predicted winning (at
// equal time the larger batch, then the earlier strategy). `batch` 0: nothing fits, and `rejected`
// says why.
struct BatchChoice {
  Strategy strategy;
  int64_t batch = 0;
  // The other strategies that fit, with their predicted step times (empty with one candidate).
  std::vector<std::string> weighed;
  std::string rejected;
};
BatchChoice ChooseBatch(const fitrun::v1::JobSpec& spec, const ModelProfile& model,
                        const std::vector<Strategy>& strategies, const RankEstimate& estimate,
                        const PlanLimits& limits, const std::string& described_layout);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_PLAN_SEARCH_H_
