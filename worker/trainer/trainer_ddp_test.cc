// Two ranks as threads of one process over a real Gloo group and FileStore: the training loop,
// the broadcast and the gradient all-reduce together, without processes or the network.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <cstdio>
#include <thread>

#include "gtest/gtest.h"
#include "worker/ddp/flat_all_reduce.h"
#include "worker/ddp/process_group.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {
namespace {

constexpr int kWorld = 2;

LabeledImages SyntheticSet(int64_t n) {
  at::manual_seed(11);
  LabeledImages set;
  set.labels = at::arange(n, at::kLong).remainder(10);
  set.images = at::randn({n, 1, 28, 28}) * 0.5;
  for (int64_t i = 0; i < n; ++i) set.images[i][0].narrow(0, 2 * (i % 10), 2).add_(2.0);
  return set;
}

TEST(TrainerDdpTest, RanksEndBitwiseEqualWithOneGlobalLoss) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string store_path = std::string(root != nullptr ? root : "/tmp") + "/trainer_ddp_store";
  std::remove(store_path.c_str());
  const LabeledImages train = SyntheticSet(512);
  const LabeledImages test = SyntheticSet(100);

  fitrun::v1::ModelSpec spec;
  spec.set_builtin("mlp");
  // Different seeds per rank: only the broadcast can make them agree.
  std::vector<std::shared_ptr<Model>> models;
  for (int rank = 0; rank < kWorld; ++rank) {
    auto model = CreateModel(spec, 100 + rank);
    ASSERT_TRUE(model.ok());
    models.push_back(*model);
  }
  ASSERT_NE(ParameterChecksum(*models[0]), ParameterChecksum(*models[1]));

  std::vector<FakeProgressSink> sinks(kWorld);
  std::vector<absl::StatusOr<TrainResult>> results(kWorld, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      auto store = c10::make_intrusive<c10d::FileStore>(store_path, kWorld);
      auto group = CreateGlooProcessGroup(store, rank, kWorld, absl::Seconds(10));
      ASSERT_TRUE(group.ok()) << group.status();
      ASSERT_TRUE(BroadcastModuleState(**group, *models[rank]).ok());
      auto synchronizer = FlatAllReduceSynchronizer::Create(*group, models[rank]->parameters());
      ASSERT_TRUE(synchronizer.ok()) << synchronizer.status();

      TrainerOptions options;
      options.rank = rank;
      options.world_size = kWorld;
      options.per_device_batch = 16;
      options.grad_accum_steps = 2;
      options.learning_rate = 0.05;
      options.total_steps = 12;
      options.seed = 5;
      options.optimizer.set_momentum(0.9);
      options.progress_interval = absl::ZeroDuration();
      std::optional<LabeledImages> test_set;
      if (rank == 0) test_set = test;
      auto trainer = Trainer::Create(options, models[rank], train, test_set, synchronizer->get(),
                                     &sinks[rank]);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      results[rank] = (*trainer)->Run();
    });
  }
  for (auto& t : threads) t.join();

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

}  // namespace
}  // namespace fitrun::worker
