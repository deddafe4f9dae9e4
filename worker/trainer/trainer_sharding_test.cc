// Optimizer states sharded over ranks (ZeRO stage 1) in the training loop: ranks as threads over a
// real Gloo group (thread_ranks.h). Sharding must change where the states live, not the training:
// each run below is compared with plain DDP's, and checkpoints cross between sharded and unsharded
// runs and world sizes.
#include <ATen/ATen.h>

#include <filesystem>
#include <set>
#include <torch/optim/adamw.h>
#include <torch/serialize/input-archive.h>

#include "gtest/gtest.h"
#include "worker/checkpoint/checkpoint_store.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/c10d_optimizer_state_sharding.h"
#include "worker/ddp/process_group.h"
#include "worker/ddp/thread_ranks.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/trainer_testing.h"

namespace fitrun::worker {
namespace {

constexpr int64_t kGlobalBatch = 48;  // splits over 1, 2 and 3 ranks

struct Run {
  int world = 2;
  bool sharded = true;
  int64_t total_steps = 8;
  // Checkpoints every 4 steps into this store (none when null), and the step to resume from (0: none).
  CheckpointStore* checkpoints = nullptr;
  int64_t resume_from = 0;
};

// Trains the mlp with AdamW (decoupled weight decay: states and parameters both matter) over
// `run.world` thread ranks, the global batch fixed, and returns rank 0's model after checking that
// every rank ended with the same parameters.
std::shared_ptr<Model> Train(const TensorDataset& train, const Run& run, const std::string& name) {
  std::vector<std::shared_ptr<Model>> models;
  for (int rank = 0; rank < run.world; ++rank) models.push_back(MlpFromSeed(42 + rank));
  RunRanksAsThreads(
      run.world, name,
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
        ASSERT_TRUE(BroadcastModuleState(*group, *models[rank]).ok());
        BucketedReducer::Options buckets;
        buckets.bucket_cap_bytes = 256 << 10;
        auto reducer = BucketedReducer::Create(group, models[rank]->parameters(), buckets);
        ASSERT_TRUE(reducer.ok()) << reducer.status();
        std::unique_ptr<C10dOptimizerStateSharding> sharding;
        if (run.sharded) {
          auto created = C10dOptimizerStateSharding::Create(group, models[rank]->parameters());
          ASSERT_TRUE(created.ok()) << created.status();
          sharding = *std::move(created);
        }
        TrainerOptions options;
        options.rank = rank;
        options.world_size = run.world;
        options.per_device_batch = kGlobalBatch / run.world;
        options.learning_rate = 0.002;
        options.total_steps = run.total_steps;
        options.seed = 7;
        options.optimizer.set_kind(fitrun::v1::OPTIMIZER_KIND_ADAMW);
        options.optimizer.set_weight_decay(0.1);
        options.checkpoints = run.checkpoints;
        options.checkpoint_every_steps = 4;
        options.optimizer_state_sharding = sharding.get();
        FakeProgressSink sink;
        auto trainer = Trainer::Create(options, models[rank], train, std::nullopt, reducer->get(), &sink);
        ASSERT_TRUE(trainer.ok()) << trainer.status();
        if (run.resume_from > 0) {
          absl::Status resumed = (*trainer)->ResumeFrom(*run.checkpoints, run.resume_from);
          ASSERT_TRUE(resumed.ok()) << resumed;
        }
        absl::StatusOr<TrainResult> result = (*trainer)->Run();
        ASSERT_TRUE(result.ok()) << result.status();
        for (const CheckpointNotice& notice : sink.checkpoints()) EXPECT_EQ(notice.error, "") << notice.step;
      },
      absl::Seconds(30));
  for (int rank = 1; rank < run.world; ++rank) {
    EXPECT_EQ(ParameterChecksum(*models[rank]), ParameterChecksum(*models[0])) << "rank " << rank;
  }
  return models[0];
}

std::unique_ptr<CheckpointStore> FreshStore(const std::string& name) {
  auto store = CheckpointStore::Create({FreshTestPath(name), 4});
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

TEST(PartitionParametersTest, LargestFirstToTheLeastLoadedRank) {
  EXPECT_EQ(PartitionParameters({10, 30, 20, 5}, 2), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(PartitionParameters({10, 30, 20, 5}, 1), (std::vector<int>{0, 0, 0, 0}));
  // Ties keep the model's order; more ranks than parameters leave some ranks without any.
  EXPECT_EQ(PartitionParameters({4, 4, 4}, 2), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(PartitionParameters({7, 3}, 4), (std::vector<int>{0, 1}));
  EXPECT_EQ(PartitionParameters({}, 3), (std::vector<int>{}));
}

// Each rank steps its share with the gradients every rank has, so the parameters are plain DDP's bit
// for bit, on 2 ranks and on 3 (where the mlp's six tensors split unevenly).
TEST(TrainerShardingTest, ShardedStatesTrainAsPlainDdpBitwise) {
  SkipUnlessCpuRanks(3);
  const TensorDataset train = SyntheticSet(512);
  for (int world : {2, 3}) {
    const std::shared_ptr<Model> plain = Train(train, {.world = world, .sharded = false}, "plain_store");
    EXPECT_GT(MaxAbsDifference(*plain, *MlpFromSeed(42)), 1e-3);  // training moved the weights
    const std::shared_ptr<Model> sharded = Train(train, {.world = world, .sharded = true}, "sharded_store");
    EXPECT_EQ(ParameterChecksum(*sharded), ParameterChecksum(*plain)) << world << " ranks";
  }
}

// A sharded checkpoint is one file per rank holding only that rank's parameters' states, and the run
// resumed from it (on 2 ranks sharded, on 1 rank, or from an unsharded checkpoint onto sharded ranks)
// ends where the uninterrupted run does.
TEST(TrainerShardingTest, CheckpointsResumeAcrossShardingAndWorldSize) {
  SkipUnlessCpuRanks(2);
  const TensorDataset train = SyntheticSet(512);
  const std::shared_ptr<Model> uninterrupted = Train(train, {.world = 2, .sharded = false}, "whole_store");

  std::unique_ptr<CheckpointStore> sharded = FreshStore("sharded_checkpoints");
  Train(train, {.world = 2, .sharded = true, .checkpoints = sharded.get()}, "save_store");
  EXPECT_EQ(sharded->Steps(), (std::vector<int64_t>{8, 4}));
  // Each rank's file holds the states of exactly the parameters it owns.
  std::vector<int64_t> counts;
  for (const at::Tensor& p : MlpFromSeed(1)->parameters()) counts.push_back(p.numel());
  const std::vector<int> owners = PartitionParameters(counts, 2);
  for (int rank = 0; rank < 2; ++rank) {
    torch::serialize::InputArchive archive;
    archive.load_from(sharded->OptimizerShardPathFor(4, rank, 2));
    std::set<std::string> held;
    for (const std::string& key : archive.keys()) {
      if (key.rfind("parameter_", 0) == 0) held.insert(key);
    }
    std::set<std::string> owned;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (owners[i] == rank) owned.insert("parameter_" + std::to_string(i));
    }
    EXPECT_FALSE(owned.empty());
    EXPECT_EQ(held, owned) << "rank " << rank;
  }

  const std::shared_ptr<Model> resumed_sharded =
      Train(train, {.world = 2, .sharded = true, .checkpoints = sharded.get(), .resume_from = 4}, "resume2_store");
  EXPECT_EQ(ParameterChecksum(*resumed_sharded), ParameterChecksum(*uninterrupted));
  const std::shared_ptr<Model> resumed_alone =
      Train(train, {.world = 1, .sharded = false, .checkpoints = sharded.get(), .resume_from = 4}, "resume1_store");
  EXPECT_LE(MaxAbsDifference(*resumed_alone, *uninterrupted), 1e-5);

  std::unique_ptr<CheckpointStore> whole = FreshStore("whole_checkpoints");
  Train(train, {.world = 2, .sharded = false, .checkpoints = whole.get()}, "save_whole_store");
  EXPECT_FALSE(std::filesystem::exists(whole->OptimizerShardPathFor(4, 0, 2)));
  const std::shared_ptr<Model> whole_into_shards =
      Train(train, {.world = 2, .sharded = true, .checkpoints = whole.get(), .resume_from = 4}, "resume_whole_store");
  EXPECT_EQ(ParameterChecksum(*whole_into_shards), ParameterChecksum(*uninterrupted));
}

// A checkpoint one of whose rank files is missing does not load, so the run falls back to an older one.
TEST(TrainerShardingTest, ACheckpointMissingARankFileDoesNotLoad) {
  SkipUnlessCpuRanks(2);
  const TensorDataset train = SyntheticSet(512);
  std::unique_ptr<CheckpointStore> store = FreshStore("torn_checkpoints");
  Train(train, {.world = 2, .sharded = true, .checkpoints = store.get()}, "torn_store");
  std::filesystem::remove(store->OptimizerShardPathFor(8, 1, 2));
  std::shared_ptr<Model> model = MlpFromSeed(42);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(0.002).weight_decay(0.1));
  absl::StatusOr<TrainingPosition> torn = store->Load(8, *model, adamw);
  EXPECT_EQ(torn.status().code(), absl::StatusCode::kDataLoss) << torn.status();
  EXPECT_NE(torn.status().message().find("optimizer-1-of-2"), std::string::npos) << torn.status();
  absl::StatusOr<std::optional<TrainingPosition>> latest = store->LoadLatest(*model, adamw);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->step, 4);
}

// Pruning takes a checkpoint's rank files with it.
TEST(TrainerShardingTest, PruningRemovesACheckpointsRankFiles) {
  SkipUnlessCpuRanks(2);
  const TensorDataset train = SyntheticSet(512);
  auto store = CheckpointStore::Create({FreshTestPath("pruned_checkpoints"), 1});
  ASSERT_TRUE(store.ok()) << store.status();
  Train(train, {.world = 2, .sharded = true, .checkpoints = store->get()}, "pruned_store");
  EXPECT_EQ((*store)->Steps(), (std::vector<int64_t>{8}));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(std::filesystem::exists((*store)->OptimizerShardPathFor(4, rank, 2)));
    EXPECT_TRUE(std::filesystem::exists((*store)->OptimizerShardPathFor(8, rank, 2)));
  }
}

}  // namespace
}  // namespace fitrun::worker
