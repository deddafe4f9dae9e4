// The planner's search, step by step: layouts in order of preference, a layout's budget, the
// strategies a spec allows, the estimate held against the budget, and one layout's choice.
#include "server/core/memory/plan_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/core/specs/test_specs.h"
#include "server/core/specs/workloads.h"

namespace fitrun::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

std::vector<DeviceCapacity> Devices(std::vector<std::pair<std::string, int64_t>> node_and_bytes) {
  std::vector<DeviceCapacity> devices;
  for (size_t i = 0; i < node_and_bytes.size(); ++i) {
    devices.push_back({absl::StrCat("cpu:", i), node_and_bytes[i].second, node_and_bytes[i].first});
  }
  return devices;
}

std::vector<const DeviceCapacity*> Pointers(const std::vector<DeviceCapacity>& devices) {
  std::vector<const DeviceCapacity*> out;
  for (const DeviceCapacity& d : devices) out.push_back(&d);
  return out;
}

TEST(PlanSearchTest, DivisorsLargestFirst) {
  EXPECT_THAT(DivisorsDescending(12), ElementsAre(12, 6, 4, 3, 2, 1));
  EXPECT_THAT(DivisorsDescending(1), ElementsAre(1));
}

// Most devices first, then fewest nodes, each node the same number of ranks.
TEST(PlanSearchTest, LayoutsPreferMoreDevicesThenFewerNodes) {
  const std::vector<DeviceCapacity> devices = Devices({{"n1", 4 * kMiB}, {"n1", 3 * kMiB}, {"n2", 2 * kMiB}});
  const std::vector<Layout> layouts = LayoutsByPreference(Pointers(devices), 1, 3, 1, 2);
  std::vector<std::string> described;
  for (const Layout& l : layouts) described.push_back(DescribeLayout(l, true));
  EXPECT_THAT(described, ElementsAre("2 devices (1 node x 2)", "2 devices (2 nodes x 1)", "1 devices (1 node x 1)"));
  EXPECT_EQ(layouts[0].devices[1]->id, "cpu:1");
}

TEST(PlanSearchTest, ABudgetIsTheTightestDeviceLessTheHeadroom) {
  const std::vector<DeviceCapacity> devices = Devices({{"", 100 * kMiB}, {"", 80 * kMiB}});
  Layout layout;
  layout.devices = Pointers(devices);
  const RankBudget budget = BudgetOf(layout, 64, 0.1);
  EXPECT_EQ(budget.ranks, 2);
  EXPECT_EQ(budget.per_rank, 32);
  EXPECT_EQ(budget.tightest->id, "cpu:1");
  EXPECT_EQ(budget.usable_bytes, 72 * kMiB);
}

// A built-in job of several ranks may shard unless the spec forbids it; a script only where it pins it.
TEST(PlanSearchTest, StrategiesFollowTheSpec) {
  fitrun::v1::JobSpec spec = MlpTestSpec(64, 2, 2);
  const ModelProfile model = *ProfileFor(spec);
  EXPECT_EQ(StrategiesFor(spec, model, 2).size(), 2u);
  EXPECT_EQ(StrategiesFor(spec, model, 1).size(), 1u) << "one rank has nothing to shard over";
  spec.mutable_ddp()->set_zero_stage(0);
  EXPECT_EQ(StrategiesFor(spec, model, 2).size(), 1u);
  spec.mutable_ddp()->set_zero_stage(1);
  const std::vector<Strategy> pinned = StrategiesFor(spec, model, 2);
  ASSERT_EQ(pinned.size(), 1u);
  EXPECT_TRUE(pinned[0].sharded);
  spec.mutable_ddp()->clear_zero_stage();
  spec.mutable_script()->add_command("train.py");
  EXPECT_EQ(StrategiesFor(spec, model, 2).size(), 1u) << "a script shards only where the spec pins it";
}

// The largest divisor that fits, below a batch that ran out of memory in the same form.
TEST(PlanSearchTest, TheLargestFittingBatchRespectsTheOutOfMemoryBound) {
  const fitrun::v1::JobSpec spec = MlpTestSpec(64, 1, 1);
  ModelProfile model = *ProfileFor(spec);
  model.measured = MemoryCurve({{1, 10 * kMiB}, {64, 73 * kMiB}});  // 1 MiB a sample
  const std::vector<DeviceCapacity> devices = Devices({{"", 100 * kMiB}});
  Layout layout;
  layout.devices = Pointers(devices);
  const RankBudget budget = BudgetOf(layout, 64, 0.0);
  const EstimatorOptions estimator;
  const RankEstimate estimate(spec, estimator, budget);
  const Strategy kept{&model, false};
  EXPECT_EQ(estimate.LargestFitting(kept, {}), 64);
  PlanLimits after_oom;
  after_oom.max_per_device_batch = 40;
  EXPECT_EQ(estimate.LargestFitting(kept, after_oom), 32);
  PlanLimits other_form;
  other_form.max_per_device_batch_recomputing = 40;
  EXPECT_EQ(estimate.LargestFitting(kept, other_form), 64) << "an error of the other form bounds nothing here";
}

TEST(PlanSearchTest, ChoosingABatchSaysWhyNothingFits) {
  const fitrun::v1::JobSpec spec = MlpTestSpec(64, 1, 1);
  ModelProfile model = *ProfileFor(spec);
  model.measured = MemoryCurve({{1, 200 * kMiB}, {64, 263 * kMiB}});
  const std::vector<DeviceCapacity> devices = Devices({{"", 100 * kMiB}});
  Layout layout;
  layout.devices = Pointers(devices);
  const RankBudget budget = BudgetOf(layout, 64, 0.0);
  const EstimatorOptions estimator;
  const RankEstimate estimate(spec, estimator, budget);
  const BatchChoice choice = ChooseBatch(spec, model, StrategiesFor(spec, model, 1), estimate, {}, "1 devices");
  EXPECT_EQ(choice.batch, 0);
  EXPECT_THAT(choice.rejected, HasSubstr("1 devices: even per-device batch 1 needs"));
  fitrun::v1::JobSpec fixed = spec;
  fixed.mutable_resources()->set_per_device_batch(48);
  const BatchChoice not_a_divisor =
      ChooseBatch(fixed, model, StrategiesFor(fixed, model, 1), estimate, {}, "1 devices");
  EXPECT_EQ(not_a_divisor.batch, 0);
  EXPECT_THAT(not_a_divisor.rejected, HasSubstr("is not a multiple of spec.resources.per_device_batch 48"));
}

}  // namespace
}  // namespace fitrun::server
