// Two ranks as threads of one process over a real Gloo group and FileStore: the training loop,
// the broadcast and the gradient all-reduce together, without processes or the network. Without Gloo
// (thread_ranks.h) only the one-rank test runs; the others skip.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <algorithm>
#include <cstdio>

#include <torch/optim/sgd.h>

#include "gtest/gtest.h"
#include "proto/contract/testing/temp_dir.h"
#include "worker/checkpoint/checkpoint_store.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/flat_all_reduce.h"
#include "worker/ddp/process_group.h"
#include "worker/ddp/thread_ranks.h"
#include "worker/testing/trainer_options.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/trainer_testing.h"

namespace fitrun::worker {
namespace {

constexpr int kWorld = 2;

// An mlp per rank, rank r's seeded `seed` + r, on `device`.
std::vector<std::shared_ptr<Model>> MlpPerRank(uint64_t seed, const c10::Device& device = c10::kCPU) {
  std::vector<std::shared_ptr<Model>> models;
  for (int rank = 0; rank < kWorld; ++rank) {
    models.push_back(MlpFromSeed(seed + rank));
    models.back()->to(device);
  }
  return models;
}

TEST(TrainerDdpTest, RanksEndBitwiseEqualWithOneGlobalLoss) {
  SkipUnlessCpuRanks(kWorld);
  const std::string store_name = "trainer_ddp_store";
  const TensorDataset train = SyntheticSet(512);
  const TensorDataset test = SyntheticSet(100);

  // Different seeds per rank: only the broadcast can make them agree.
  const std::vector<std::shared_ptr<Model>> models = MlpPerRank(100);
  ASSERT_NE(ParameterChecksum(*models[0]), ParameterChecksum(*models[1]));

  std::vector<FakeProgressSink> sinks(kWorld);
  std::vector<absl::StatusOr<TrainResult>> results(kWorld, absl::UnknownError("not run"));
  RunRanksAsThreads(kWorld, store_name, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    ASSERT_TRUE(BroadcastModuleState(*group, *models[rank]).ok());
    auto synchronizer = FlatAllReduceSynchronizer::Create(group, models[rank]->parameters());
    ASSERT_TRUE(synchronizer.ok()) << synchronizer.status();

    TrainerOptions options = testing::SmallTrainerOptions();
    options.rank = rank;
    options.world_size = kWorld;
    options.seed = 5;
    std::optional<TensorDataset> test_set;
    if (rank == 0) test_set = test;
    auto trainer = Trainer::Create(options, models[rank], train, test_set, synchronizer->get(),
                                   &sinks[rank]);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    results[rank] = (*trainer)->Run();
  });

  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->parameter_checksum, results[1]->parameter_checksum);
  EXPECT_EQ(results[0]->final_loss, results[1]->final_loss);
  EXPECT_TRUE(results[0]->has_test_accuracy);
  EXPECT_FALSE(results[1]->has_test_accuracy);
  const auto progress = sinks[0].progress();
  ASSERT_EQ(progress.size(), 12u);
  EXPECT_LT(progress.back().loss, progress.front().loss);
}

TrainerOptions EquivalenceOptions(int rank, int world_size, int64_t per_device_batch, int accumulation) {
  TrainerOptions options = testing::SmallTrainerOptions(rank, world_size, per_device_batch, accumulation);
  options.total_steps = 8;
  options.seed = 7;
  return options;
}

// One process, no communication: the reference runs.
std::shared_ptr<Model> TrainAlone(const TensorDataset& train, int64_t batch, int accumulation) {
  std::shared_ptr<Model> model = MlpFromSeed(42);
  LocalGradientSynchronizer local;
  FakeProgressSink sink;
  auto trainer = Trainer::Create(EquivalenceOptions(0, 1, batch, accumulation), model, train,
                                 std::nullopt, &local, &sink);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  EXPECT_TRUE(result.ok()) << result.status();
  return model;
}

// Two ranks with the bucketed, overlapped reducer (small buckets, so several are in flight).
std::vector<std::shared_ptr<Model>> TrainTwoRanks(const TensorDataset& train, int64_t per_device_batch,
                                                  int accumulation, const std::string& store_name,
                                                  int64_t total_steps = 8) {
  std::vector<std::shared_ptr<Model>> models = {MlpFromSeed(42), MlpFromSeed(43)};
  RunRanksAsThreads(kWorld, store_name, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    ASSERT_TRUE(BroadcastModuleState(*group, *models[rank]).ok());
    BucketedReducer::Options buckets;
    buckets.first_bucket_cap_bytes = 16 << 10;  // fc3 alone; a bucket closes once it reaches its cap
    buckets.bucket_cap_bytes = 512 << 10;
    auto reducer = BucketedReducer::Create(group, models[rank]->parameters(), buckets);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    ASSERT_GT((*reducer)->BucketLayout().size(), 2u);
    FakeProgressSink sink;
    TrainerOptions options = EquivalenceOptions(rank, kWorld, per_device_batch, accumulation);
    options.total_steps = total_steps;
    auto trainer = Trainer::Create(options, models[rank], train, std::nullopt, reducer->get(), &sink);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    absl::StatusOr<TrainResult> result = (*trainer)->Run();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ((*reducer)->comm_stats().synchronized_steps, total_steps);
  }, absl::Seconds(20));
  return models;
}

// The definition of correct data parallelism: 2 ranks x B/2, 1 rank x B and 1 rank x 2
// accumulated micro-batches of B/2 see the same samples per step and end with the same parameters.
TEST(TrainerDdpTest, TwoRanksMatchOneRankAndAccumulation) {
  SkipUnlessCpuRanks(kWorld);
  constexpr int64_t kGlobalBatch = 32;
  const TensorDataset train = SyntheticSet(512);
  const std::shared_ptr<Model> whole_batch = TrainAlone(train, kGlobalBatch, 1);
  const std::shared_ptr<Model> accumulated = TrainAlone(train, kGlobalBatch / 2, 2);
  const std::vector<std::shared_ptr<Model>> ranks = TrainTwoRanks(train, kGlobalBatch / 2, 1, "equiv_store");

  // Training moved the weights (so agreement is not trivial).
  EXPECT_GT(MaxAbsDifference(*whole_batch, *MlpFromSeed(42)), 1e-3);
  EXPECT_LE(MaxAbsDifference(*ranks[0], *whole_batch), 1e-5);
  EXPECT_LE(MaxAbsDifference(*ranks[0], *accumulated), 1e-5);
  EXPECT_EQ(ParameterChecksum(*ranks[0]), ParameterChecksum(*ranks[1]));
}

// One rank over a process group trains as one rank alone: the broadcast, the bucketed reducer's
// bucket views and hooks, and the all-reduce of one rank leave the gradients backward made. What a
// single rank tests of the data-parallel loop, so it runs wherever one CPU rank can (thread_ranks.h),
// without Gloo too.
TEST(TrainerDdpTest, OneRankOverAGroupMatchesTrainingAlone) {
  const TensorDataset train = SyntheticSet(512);
  const std::shared_ptr<Model> alone = TrainAlone(train, 16, 2);
  const std::shared_ptr<Model> model = MlpFromSeed(42);
  RunRanksAsThreads(
      1, "one_rank_store",
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
        ASSERT_TRUE(BroadcastModuleState(*group, *model).ok());
        BucketedReducer::Options buckets;
        buckets.first_bucket_cap_bytes = 16 << 10;
        buckets.bucket_cap_bytes = 512 << 10;
        auto reducer = BucketedReducer::Create(group, model->parameters(), buckets);
        ASSERT_TRUE(reducer.ok()) << reducer.status();
        ASSERT_GT((*reducer)->BucketLayout().size(), 2u);
        FakeProgressSink sink;
        auto trainer = Trainer::Create(EquivalenceOptions(rank, 1, 16, 2), model, train, std::nullopt,
                                       reducer->get(), &sink);
        ASSERT_TRUE(trainer.ok()) << trainer.status();
        absl::StatusOr<TrainResult> result = (*trainer)->Run();
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ((*reducer)->comm_stats().synchronized_steps, 8);
      },
      absl::Seconds(20));
  EXPECT_GT(MaxAbsDifference(*alone, *MlpFromSeed(42)), 1e-3);
  EXPECT_LE(MaxAbsDifference(*model, *alone), 1e-6);
}

// Accumulation across ranks (no_sync on the first micro-batch) matches one rank with the whole batch.
TEST(TrainerDdpTest, TwoRanksWithAccumulationMatchOneRank) {
  SkipUnlessCpuRanks(kWorld);
  const TensorDataset train = SyntheticSet(512);
  const std::shared_ptr<Model> whole_batch = TrainAlone(train, 32, 1);
  const std::vector<std::shared_ptr<Model>> ranks = TrainTwoRanks(train, 8, 2, "equiv_accum_store");
  EXPECT_LE(MaxAbsDifference(*ranks[1], *whole_batch), 1e-5);
}

// 517 samples over 2 ranks: the odd one out is dropped for every rank alike, so both ranks run the
// same number of steps per epoch and cross the epoch boundary together instead of one waiting forever
// (a rank left waiting would fail with the process group's 20 s collective timeout, and TrainTwoRanks
// checks that each rank ran and synchronized all 20 steps).
TEST(TrainerDdpTest, UnevenDatasetAcrossEpochsDoesNotHang) {
  SkipUnlessCpuRanks(kWorld);
  const TensorDataset train = SyntheticSet(517);
  const std::vector<std::shared_ptr<Model>> ranks = TrainTwoRanks(train, 16, 1, "uneven_store", 20);
  EXPECT_EQ(ParameterChecksum(*ranks[0]), ParameterChecksum(*ranks[1]));
}

// What fitrun-worker does with a plan device, on an explicit CPU device: the model is moved there
// before the broadcast, the bucketed reducer's buckets and the trainer's micro-batches and test set
// follow it, and rank 0's final checkpoint loads into a fresh model with the trained parameters.
TEST(TrainerDdpTest, ExplicitDeviceWithTheBucketedReducerSavesALoadableCheckpoint) {
  SkipUnlessCpuRanks(kWorld);
  const contract::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string store_name = "device_store";
  const std::string checkpoint_dir = dir.Join("device_checkpoints");
  absl::StatusOr<std::unique_ptr<CheckpointStore>> checkpoints = CheckpointStore::Create({checkpoint_dir, 2});
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  const c10::Device device(c10::kCPU);
  const TensorDataset train = SyntheticSet(512);
  const TensorDataset test = SyntheticSet(100);

  const std::vector<std::shared_ptr<Model>> models = MlpPerRank(200, device);
  std::vector<FakeProgressSink> sinks(kWorld);
  std::vector<absl::StatusOr<TrainResult>> results(kWorld, absl::UnknownError("not run"));
  RunRanksAsThreads(kWorld, store_name, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    ASSERT_TRUE(BroadcastModuleState(*group, *models[rank]).ok());
    auto reducer = BucketedReducer::Create(group, models[rank]->parameters(), BucketedReducer::Options());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    TrainerOptions options = EquivalenceOptions(rank, kWorld, 16, 2);
    options.device = device;
    options.checkpoints = checkpoints->get();
    options.checkpoint_every_steps = 4;
    std::optional<TensorDataset> test_set;
    if (rank == 0) test_set = test;
    auto trainer = Trainer::Create(options, models[rank], train, test_set, reducer->get(), &sinks[rank]);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    results[rank] = (*trainer)->Run();
  });
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->parameter_checksum, results[1]->parameter_checksum);
  EXPECT_TRUE(results[0]->has_test_accuracy);
  for (const at::Tensor& p : models[0]->parameters()) EXPECT_EQ(p.grad().device(), device);

  EXPECT_EQ((*checkpoints)->Steps(), (std::vector<int64_t>{8, 4}));
  const std::shared_ptr<Model> fresh = MlpFromSeed(300);
  fresh->to(device);
  torch::optim::SGD sgd(fresh->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  absl::StatusOr<TrainingPosition> position = (*checkpoints)->Load(8, *fresh, sgd);
  ASSERT_TRUE(position.ok()) << position.status();
  EXPECT_EQ(position->step, 8);
  EXPECT_EQ(ParameterChecksum(*fresh), results[0]->parameter_checksum);
}

}  // namespace
}  // namespace fitrun::worker
