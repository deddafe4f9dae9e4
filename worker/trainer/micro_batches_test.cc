#include "worker/trainer/micro_batches.h"

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace fitrun::worker {
namespace {

// Two inputs of different shapes and dtypes, and targets, whose rows say which sample they are.
TensorDataset NumberedSet(int64_t n) {
  TensorDataset set;
  set.inputs = {at::arange(n * 6, at::kFloat).view({n, 2, 3}), at::arange(n, at::kLong).mul(10)};
  set.targets = at::arange(n, at::kLong);
  return set;
}

DistributedSampler Sampler(int64_t n, int world, int rank) {
  absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create({n, world, rank, /*seed=*/4});
  EXPECT_TRUE(sampler.ok());
  return *sampler;
}

// What the trainer gathered before there were sources: rows of the epoch's share, taken in order.
std::vector<int64_t> ExpectedRows(const DistributedSampler& sampler, const MicroBatchOrder& order, int64_t step,
                                  int64_t m) {
  const std::vector<int64_t> shard = sampler.EpochIndices((step - 1) / order.steps_per_epoch);
  const int64_t begin = ((step - 1) % order.steps_per_epoch * order.grad_accum_steps + m) * order.per_device_batch;
  return std::vector<int64_t>(shard.begin() + begin, shard.begin() + begin + order.per_device_batch);
}

TEST(MicroBatchesTest, EveryPlacementGivesTheRowsOfTheSamplersOrderAcrossEpochs) {
  const TensorDataset set = NumberedSet(100);
  const DistributedSampler sampler = Sampler(100, 2, 1);  // 50 samples a rank
  MicroBatchOrder order;
  order.first_step = 3;  // as after a resume
  order.total_steps = 11;
  order.steps_per_epoch = 4;  // 4 steps x 3 micro-batches x 4 rows = 48 of 50
  order.grad_accum_steps = 3;
  order.per_device_batch = 4;
  for (DataPlacement placement : {DataPlacement::kHost, DataPlacement::kDevice, DataPlacement::kPinnedPrefetch}) {
    SCOPED_TRACE(DataPlacementName(placement));
    absl::StatusOr<std::unique_ptr<MicroBatchSource>> source =
        CreateMicroBatchSource(placement, set, sampler, order, c10::Device(c10::kCPU), /*depth=*/2);
    ASSERT_TRUE(source.ok()) << source.status();
    for (int64_t step = order.first_step; step <= order.total_steps; ++step) {
      for (int64_t m = 0; m < order.grad_accum_steps; ++m) {
        absl::StatusOr<MicroBatch> batch = (*source)->Get(step, m);
        ASSERT_TRUE(batch.ok()) << batch.status();
        const std::vector<int64_t> rows = ExpectedRows(sampler, order, step, m);
        const at::Tensor expected = at::tensor(rows, at::kLong);
        ASSERT_TRUE(batch->targets.equal(expected)) << "step " << step << " micro-batch " << m;
        ASSERT_EQ(batch->inputs.size(), 2u);
        EXPECT_TRUE(batch->inputs[0].equal(set.inputs[0].index_select(0, expected)));
        EXPECT_TRUE(batch->inputs[1].equal(expected.mul(10)));
        EXPECT_EQ(batch->inputs[0].sizes(), (std::vector<int64_t>{4, 2, 3}));
      }
    }
  }
}

TEST(MicroBatchesTest, PrefetchingRefusesAnotherOrderAndStopsWhenDestroyedEarly) {
  const TensorDataset set = NumberedSet(64);
  MicroBatchOrder order;
  order.total_steps = 1000;  // far more than will be asked: the gatherer waits for room, then stops
  order.steps_per_epoch = 8;
  order.grad_accum_steps = 2;
  order.per_device_batch = 4;
  absl::StatusOr<std::unique_ptr<MicroBatchSource>> source = CreateMicroBatchSource(
      DataPlacement::kPinnedPrefetch, set, Sampler(64, 1, 0), order, c10::Device(c10::kCPU), /*depth=*/3);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE((*source)->Get(1, 0).ok());
  EXPECT_EQ((*source)->Get(1, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*source)->Get(2, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*source)->Get(1, 1).ok());
  ASSERT_TRUE((*source)->Get(2, 0).ok());
  EXPECT_EQ((*source)->Get(1001, 0).status().code(), absl::StatusCode::kOutOfRange);
  source->reset();  // joins the gatherer, which is waiting for room
}

TEST(MicroBatchesTest, AGpuHoldsTheSetWhereHalfTheRoomLeftTakesIt) {
  EXPECT_EQ(ChooseDataPlacement(c10::Device(c10::kCPU), 1, 1 << 30), DataPlacement::kHost);
  const c10::Device gpu(c10::kCUDA, 0);
  EXPECT_EQ(ChooseDataPlacement(gpu, 188 << 20, 1LL << 34), DataPlacement::kDevice);
  EXPECT_EQ(ChooseDataPlacement(gpu, 188 << 20, 376 << 20), DataPlacement::kDevice);
  EXPECT_EQ(ChooseDataPlacement(gpu, 188 << 20, 375 << 20), DataPlacement::kPinnedPrefetch);
  EXPECT_EQ(ChooseDataPlacement(gpu, 188 << 20, -5), DataPlacement::kPinnedPrefetch);
}

TEST(MicroBatchesTest, DatasetBytesCountsEveryTensor) {
  EXPECT_EQ(DatasetBytes(NumberedSet(10)), 10 * 6 * 4 + 10 * 8 + 10 * 8);
  EXPECT_EQ(DatasetBytes(TensorDataset()), 0);
}

}  // namespace
}  // namespace fitrun::worker
