#include "worker/programs/script_rank.h"

#include <initializer_list>
#include <string>

#include "gtest/gtest.h"

namespace fitrun::worker {
namespace {

fitrun::v1::Plan PlanOn(std::initializer_list<const char*> device_ids) {
  fitrun::v1::Plan plan;
  for (const char* id : device_ids) plan.add_device_ids(id);
  return plan;
}

// torchrun leaves every GPU visible and a script takes cuda:LOCAL_RANK: each rank sees the job's
// GPUs in local-rank order, so that index LOCAL_RANK is its own, whichever GPUs the plan chose.
TEST(ScriptCudaVisibleDevicesTest, EveryRankSeesTheJobsGpusInLocalRankOrder) {
  const fitrun::v1::Plan plan = PlanOn({"cuda:2", "cuda:0", "cuda:3"});
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(ScriptCudaVisibleDevices(plan, rank), "2,0,3") << "rank " << rank;
  }
  EXPECT_EQ(ScriptCudaVisibleDevices(PlanOn({"cuda:1"}), 0), "1");
}

// A slice is on its GPU; slices of distinct GPUs index like whole ones.
TEST(ScriptCudaVisibleDevicesTest, SlicesOfDistinctGpusAreTheirGpus) {
  EXPECT_EQ(ScriptCudaVisibleDevices(PlanOn({"cuda:1#0", "cuda:0#1"}), 1), "1,0");
}

// CUDA takes a GPU once, so ranks that share one cannot each be index LOCAL_RANK: each sees its own
// GPU alone, as index 0, and a script asking for cuda:LOCAL_RANK fails loudly instead of taking a
// peer's GPU.
TEST(ScriptCudaVisibleDevicesTest, RanksSharingAGpuSeeOnlyTheirOwn) {
  const fitrun::v1::Plan plan = PlanOn({"cuda:0#0", "cuda:0#1", "cuda:1#0"});
  EXPECT_EQ(ScriptCudaVisibleDevices(plan, 0), "0");
  EXPECT_EQ(ScriptCudaVisibleDevices(plan, 1), "0");
  EXPECT_EQ(ScriptCudaVisibleDevices(plan, 2), "1");
}

TEST(ScriptCudaVisibleDevicesTest, NotFitrunsToSetOnACpuOrAClusterNode) {
  EXPECT_EQ(ScriptCudaVisibleDevices(PlanOn({"cpu:0", "cpu:1"}), 1), std::nullopt);
  // Slurm's --gpus-per-task binds each task to its GPU and hides the node's others.
  EXPECT_EQ(ScriptCudaVisibleDevices(PlanOn({"n1/cuda:0", "n1/cuda:1", "n2/cuda:0"}), 1), std::nullopt);
  // A CPU rank beside GPU ranks: LOCAL_RANK no longer indexes the GPUs.
  EXPECT_EQ(ScriptCudaVisibleDevices(PlanOn({"cpu:0", "cuda:1"}), 1), "1");
  EXPECT_EQ(ScriptCudaVisibleDevices(PlanOn({"cuda:0"}), 3), std::nullopt);
}

}  // namespace
}  // namespace fitrun::worker
