// A GPU's costs in the estimate and the plan: the lines beyond the tensors appear and add up, a CPU
// device's plan is what it was, a slice's cap is held against the allocator's needs alone and the
// plan fills it, the reserve the allocator keeps stops where the device ends, and the footprint the
// costs predict for a run measured on an H100 is above it by at most 15% (given its allocated peak).
#include "server/core/memory/device_costs.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/core/memory/estimator.h"
#include "server/core/memory/planner.h"
#include "absl/strings/str_join.h"
#include "server/core/specs/test_specs.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// An H100's figure as a plan takes it on a GPU model no run has measured: 5% above.
int64_t Above(int64_t bytes) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) * kUnmeasuredModelMargin));
}
const int64_t kOutsideAllocator = Above(527 * kMiB) + Above(158 * kMiB) + Above(560 * kMiB);

// A model whose measured allocated peak is `fixed` + `per_sample` x batch.
ModelProfile Linear(int64_t fixed, int64_t per_sample) {
  ModelProfile model;
  model.parameter_count = 1000;
  model.train_samples = 1 << 22;
  model.measured = MemoryCurve({{1, fixed + per_sample}, {1024, fixed + 1024 * per_sample}});
  return model;
}

TEST(DeviceCostsTest, ExpandableSegmentsAreReadAsPyTorchParsesThem) {
  EXPECT_TRUE(UsesExpandableSegments("expandable_segments:True"));
  EXPECT_TRUE(UsesExpandableSegments("max_split_size_mb:128, expandable_segments:true"));
  EXPECT_FALSE(UsesExpandableSegments("expandable_segments:True,expandable_segments:False"));
  EXPECT_FALSE(UsesExpandableSegments(""));
  EXPECT_LT(DefaultCudaCosts("expandable_segments:True").reserve_ratio, DefaultCudaCosts("").reserve_ratio);
}

TEST(DeviceCostsTest, AGpuEstimateCountsEveryLineBeyondTheTensorsAndTheyAddUp) {
  const fitrun::v1::JobSpec spec = MlpTestSpec();
  const ModelProfile model = Linear(100 * kMiB, kMiB);
  const DeviceCosts costs = DefaultCudaCosts(kDefaultCudaAllocatorConfig);
  const fitrun::v1::MemoryBreakdown cpu = EstimateRankMemory(model, spec, 64);
  const fitrun::v1::MemoryBreakdown gpu = EstimateRankMemory(model, spec, 64, {}, costs);
  EXPECT_EQ(cpu.allocator_bytes(), 0) << "a CPU device's estimate has no GPU lines";
  EXPECT_EQ(cpu.cuda_context_bytes(), 0);
  EXPECT_EQ(gpu.cuda_context_bytes(), Above(527 * kMiB));
  EXPECT_EQ(gpu.library_workspace_bytes(), Above(158 * kMiB));
  EXPECT_EQ(gpu.communication_bytes(), Above(560 * kMiB));
  // The allocator hands out what the CPU estimate counts, and keeps its reserve on top.
  EXPECT_EQ(gpu.allocator_bytes(), cpu.total_bytes() + gpu.allocator_reserve_bytes());
  EXPECT_GE(gpu.allocator_reserve_bytes(), Above(88 * kMiB));
  EXPECT_EQ(gpu.total_bytes(), gpu.allocator_bytes() + kOutsideAllocator);
  // A device is charged what the allocator needs (1.08x) and what lies outside it.
  EXPECT_EQ(ChargedBytes(gpu, costs),
            static_cast<int64_t>(std::ceil(cpu.total_bytes() * 1.08)) + kOutsideAllocator);
}

TEST(DeviceCostsTest, ASlicesPlanFillsItsCapWithTheAllocatorsNeedsAlone) {
  // 720720 has divisors every few percent, so the largest batch that fits is close to the cap.
  fitrun::v1::JobSpec spec = MlpTestSpec(720720, 1, 1);
  spec.set_max_steps(10);
  spec.mutable_resources()->set_memory_headroom(0.05);
  const ModelProfile model = Linear(20 * kMiB, 256 << 10);
  DeviceCosts slice = DefaultCudaCosts(kDefaultCudaAllocatorConfig);
  slice.capacity_binds_allocator_only = true;
  for (const int64_t cap : {kGiB, 2 * kGiB}) {
    absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, {{"cuda:0", cap, "", slice}});
    ASSERT_TRUE(plan.ok()) << plan.status();
    const fitrun::v1::MemoryBreakdown& p = plan->predicted();
    // What the allocator needs fits the slice less the spec's 5% headroom, and the allocated peak
    // the run will reach (the estimate less its margin) fills at least 80% of the slice.
    const int64_t allocated_peak = p.allocator_bytes() - p.allocator_reserve_bytes() - p.safety_margin_bytes();
    EXPECT_LE(ChargedBytes(p, slice), plan->usable_bytes());
    EXPECT_GE(allocated_peak, 0.8 * cap) << plan->ShortDebugString();
    // Its reserve stops at the cap; the context and the rest lie outside it.
    EXPECT_LE(p.allocator_bytes(), cap);
    EXPECT_EQ(p.total_bytes(), p.allocator_bytes() + kOutsideAllocator);
    EXPECT_EQ(plan->cuda_allocator_config(), "expandable_segments:True");
    EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("the slice's cap binds the allocator alone"));
  }
}

TEST(DeviceCostsTest, AWholeGpusPlanLeavesRoomForTheContextLibrariesAndNccl) {
  fitrun::v1::JobSpec spec = MlpTestSpec(1 << 14, 1, 1);
  const ModelProfile model = Linear(20 * kMiB, kMiB);
  const DeviceCosts costs = DefaultCudaCosts(kDefaultCudaAllocatorConfig);
  // 2 GiB free: 1.28 GiB lie outside the allocator, so far less than 2 GiB of tensors fit.
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, {{"cuda:0", 2 * kGiB, "", costs}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->predicted().total_bytes(), 2 * kGiB);
  EXPECT_LE(ChargedBytes(plan->predicted(), costs), plan->usable_bytes());
  const int64_t handed_out = plan->predicted().allocator_bytes() - plan->predicted().allocator_reserve_bytes();
  EXPECT_LT(handed_out, 2 * kGiB - kOutsideAllocator);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("the CUDA context 553.4 MiB"));
  // The same on a CPU device of 2 GiB: none of it, a larger batch.
  absl::StatusOr<fitrun::v1::Plan> cpu = PlanJob(spec, model, {{"cpu:0", 2 * kGiB, ""}});
  ASSERT_TRUE(cpu.ok());
  EXPECT_GT(cpu->per_device_batch(), plan->per_device_batch());
  EXPECT_EQ(cpu->predicted().allocator_bytes(), 0);
  EXPECT_EQ(cpu->cuda_allocator_config(), "");
}

// On the H100: the cnn with Adam at batch 4000 allocated 2,151 MiB, and with expandable segments its
// allocator reserved 1.14x that; the process held the context and cuBLAS beside it, and NCCL's buffers
// with a process group. Given that allocated peak, the costs predict a footprint at or above the
// measured one and at most 15% above.
TEST(DeviceCostsTest, TheFootprintPredictedForAnH100RunIsAtOrAboveItAndWithinFifteenPercent) {
  const DeviceCosts costs = DefaultCudaCosts(kDefaultCudaAllocatorConfig);
  const int64_t allocated = 2151 * kMiB;
  fitrun::v1::MemoryBreakdown predicted;
  predicted.set_total_bytes(allocated);
  predicted.set_allocator_reserve_bytes(std::max<int64_t>(costs.reserve_floor_bytes,
                                                          static_cast<int64_t>(allocated * (costs.reserve_ratio - 1))));
  predicted.set_allocator_bytes(allocated + predicted.allocator_reserve_bytes());
  const int64_t predicted_footprint = predicted.allocator_bytes() + costs.outside_allocator_bytes();
  const int64_t measured_footprint = static_cast<int64_t>(allocated * 1.14) + (527 + 210 - 52 + 560) * kMiB;
  EXPECT_GE(predicted_footprint, measured_footprint);
  EXPECT_LE(predicted_footprint, 1.15 * measured_footprint);
}

// A script's footprint on the GPU back to its allocator's bytes: the context, libraries and NCCL
// off, then the reserve the allocator keeps over what it hands out.
TEST(DeviceCostsTest, TheAllocatorsBytesFromAProcesssFootprint) {
  DeviceCosts costs;
  costs.context_bytes = 500 * kMiB;
  costs.library_workspace_bytes = 100 * kMiB;
  costs.communication_bytes = 400 * kMiB;
  costs.reserve_ratio = 1.25;
  costs.reserve_floor_bytes = 88 * kMiB;
  EXPECT_EQ(AllocatedFromFootprint(1000 * kMiB + 1250 * kMiB, costs), 1000 * kMiB);
  EXPECT_EQ(AllocatedFromFootprint(1050 * kMiB, costs), 50 * kMiB) << "under the floor: the reserve is all there is";
  EXPECT_EQ(AllocatedFromFootprint(600 * kMiB, costs), 0);
}

}  // namespace
}  // namespace fitrun::server
