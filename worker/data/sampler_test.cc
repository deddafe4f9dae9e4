#include "worker/data/sampler.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace fitrun::worker {
namespace {

std::vector<std::vector<int64_t>> Shards(int64_t n, int world, uint64_t seed, int64_t epoch) {
  std::vector<std::vector<int64_t>> shards;
  for (int rank = 0; rank < world; ++rank) {
    absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create({n, world, rank, seed});
    EXPECT_TRUE(sampler.ok()) << sampler.status();
    shards.push_back(sampler->EpochIndices(epoch));
  }
  return shards;
}

TEST(DistributedSamplerTest, ShardsAreDisjointEqualAndCoverAllButTheRemainder) {
  const int64_t n = 1003;
  const int world = 4;
  const auto shards = Shards(n, world, 7, 0);
  std::set<int64_t> seen;
  for (const auto& shard : shards) {
    EXPECT_EQ(shard.size(), n / world);
    for (int64_t i : shard) {
      EXPECT_GE(i, 0);
      EXPECT_LT(i, n);
      EXPECT_TRUE(seen.insert(i).second) << "index " << i << " given to two ranks";
    }
  }
  EXPECT_EQ(seen.size(), (n / world) * world);
}

TEST(DistributedSamplerTest, SameSeedAndEpochGiveTheSameOrder) {
  EXPECT_EQ(Shards(500, 2, 42, 3), Shards(500, 2, 42, 3));
}

TEST(DistributedSamplerTest, EpochsAndSeedsReshuffle) {
  EXPECT_NE(Shards(500, 2, 42, 0), Shards(500, 2, 42, 1));
  EXPECT_NE(Shards(500, 2, 42, 0), Shards(500, 2, 43, 0));
}

TEST(DistributedSamplerTest, PermutationIsAPermutation) {
  std::vector<int64_t> order = DistributedSampler::Permutation(1000, 1, 0);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(order, sorted);
}

TEST(DistributedSamplerTest, PermutationIsPinned) {
  // The order is part of a job's reproducibility: a changed generator would silently change results.
  const std::vector<int64_t> order = DistributedSampler::Permutation(10, 123, 0);
  EXPECT_EQ(order, DistributedSampler::Permutation(10, 123, 0));
  EXPECT_EQ(order, (std::vector<int64_t>{6, 9, 8, 1, 4, 0, 7, 5, 2, 3}));
}

TEST(DistributedSamplerTest, StepBlocksDoNotDependOnTheSplit) {
  // Step s of a global batch G uses permutation positions [s*G, (s+1)*G) for any world size.
  const int64_t n = 96;
  const int64_t global = 24;
  const std::vector<int64_t> order = DistributedSampler::Permutation(n, 5, 0);
  for (int world : {1, 2, 3, 4}) {
    const auto shards = Shards(n, world, 5, 0);
    const int64_t per_rank = global / world;
    for (int64_t step = 0; step < n / global; ++step) {
      std::set<int64_t> used;
      for (const auto& shard : shards) {
        used.insert(shard.begin() + step * per_rank, shard.begin() + (step + 1) * per_rank);
      }
      std::set<int64_t> expected(order.begin() + step * global, order.begin() + (step + 1) * global);
      EXPECT_EQ(used, expected) << "world " << world << " step " << step;
    }
  }
}

TEST(DistributedSamplerTest, RejectsBadOptions) {
  EXPECT_FALSE(DistributedSampler::Create({100, 0, 0, 1}).ok());
  EXPECT_FALSE(DistributedSampler::Create({100, 2, 2, 1}).ok());
  EXPECT_FALSE(DistributedSampler::Create({100, 2, -1, 1}).ok());
  EXPECT_FALSE(DistributedSampler::Create({1, 2, 0, 1}).ok());
}

}  // namespace
}  // namespace fitrun::worker
