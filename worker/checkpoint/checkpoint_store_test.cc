#include "worker/checkpoint/checkpoint_store.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "proto/contract/testing/temp_dir.h"

namespace fitrun::worker {
namespace {

struct Tiny : torch::nn::Module {
  Tiny() {
    w = register_parameter("w", at::randn({3, 2}));
    running = register_buffer("running", at::randn({2}));
  }
  at::Tensor w;
  at::Tensor running;
};

class CheckpointStoreTest : public ::testing::Test {
 protected:
  // A directory `name`/nested in the test's own, neither there yet: Create() makes the missing parents.
  std::string FreshDir(const std::string& name) const { return dir_.Join(name + "/nested"); }

  contract::TempDir dir_;
};

// One SGD step with momentum so the optimizer has state worth saving.
void Step(Tiny& model, torch::optim::SGD& sgd) {
  sgd.zero_grad();
  model.w.pow(2).sum().backward();
  sgd.step();
}

TEST_F(CheckpointStoreTest, RoundTripRestoresModelOptimizerPositionAndRng) {
  auto store = CheckpointStore::Create({FreshDir("roundtrip"), 2});
  ASSERT_TRUE(store.ok()) << store.status();
  at::manual_seed(1);
  Tiny saved;
  torch::optim::SGD sgd(saved.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Step(saved, sgd);
  absl::StatusOr<SavedCheckpoint> written = (*store)->Save({7, 1, 3}, saved, sgd);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_GT(written->bytes, 0);
  const at::Tensor next_random = at::randn({4});  // drawn after the save

  at::manual_seed(99);
  Tiny loaded;
  torch::optim::SGD loaded_sgd(loaded.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  absl::StatusOr<std::optional<TrainingPosition>> position = (*store)->LoadLatest(loaded, loaded_sgd);
  ASSERT_TRUE(position.ok()) << position.status();
  ASSERT_TRUE(position->has_value());
  EXPECT_EQ((*position)->step, 7);
  EXPECT_EQ((*position)->epoch, 1);
  EXPECT_EQ((*position)->step_in_epoch, 3);
  EXPECT_TRUE(at::equal(loaded.w, saved.w));
  EXPECT_TRUE(at::equal(loaded.running, saved.running));
  EXPECT_TRUE(at::equal(at::randn({4}), next_random));
  // Same momentum buffer: the next steps agree exactly.
  Step(saved, sgd);
  Step(loaded, loaded_sgd);
  EXPECT_TRUE(at::equal(loaded.w, saved.w));
}

// A checkpoint is written from CPU copies (so it names no CUDA device) and loaded onto the model's
// device: here an explicit CPU device, with Adam's state, whose copy goes through its own path.
TEST_F(CheckpointStoreTest, SavesCpuTensorsAndLoadsOntoTheModelsDevice) {
  auto store = CheckpointStore::Create({FreshDir("device"), 2});
  ASSERT_TRUE(store.ok()) << store.status();
  const c10::Device device(c10::kCPU);
  at::manual_seed(1);
  Tiny saved;
  saved.to(device);
  torch::optim::Adam adam(saved.parameters(), torch::optim::AdamOptions(0.01));
  for (int i = 0; i < 2; ++i) {
    adam.zero_grad();
    saved.w.pow(2).sum().backward();
    adam.step();
  }
  absl::StatusOr<SavedCheckpoint> written = (*store)->Save({2, 0, 2}, saved, adam);
  ASSERT_TRUE(written.ok()) << written.status();

  // Read without naming a device: every tensor in the file is a CPU tensor.
  torch::serialize::InputArchive archive;
  archive.load_from(written->path);
  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  at::Tensor w;
  model_archive.read("w", w);
  EXPECT_TRUE(w.is_cpu());
  EXPECT_TRUE(at::equal(w, saved.w));

  at::manual_seed(99);
  Tiny loaded;
  loaded.to(device);
  const at::Tensor parameter_before = loaded.w;  // the same tensor afterwards: hooks on it survive
  torch::optim::Adam loaded_adam(loaded.parameters(), torch::optim::AdamOptions(0.01));
  absl::StatusOr<TrainingPosition> position = (*store)->Load(2, loaded, loaded_adam);
  ASSERT_TRUE(position.ok()) << position.status();
  EXPECT_TRUE(loaded.w.is_same(parameter_before));
  EXPECT_EQ(loaded.w.device(), device);
  EXPECT_TRUE(at::equal(loaded.w, saved.w));
  EXPECT_TRUE(at::equal(loaded.running, saved.running));
  // Same moments and step count: the next Adam steps agree exactly.
  for (auto* m : {&saved, &loaded}) {
    auto& optimizer = m == &saved ? adam : loaded_adam;
    optimizer.zero_grad();
    m->w.pow(2).sum().backward();
    optimizer.step();
  }
  EXPECT_TRUE(at::equal(loaded.w, saved.w));
}

TEST_F(CheckpointStoreTest, KeepsOnlyTheNewest) {
  auto store = CheckpointStore::Create({FreshDir("prune"), 2});
  ASSERT_TRUE(store.ok());
  Tiny model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  for (int64_t step : {2, 4, 6, 8}) ASSERT_TRUE((*store)->Save({step, 0, step}, model, sgd).ok());
  EXPECT_EQ((*store)->Steps(), (std::vector<int64_t>{8, 6}));
}

TEST_F(CheckpointStoreTest, TornNewestFileFallsBackToTheOlderOne) {
  auto store = CheckpointStore::Create({FreshDir("torn"), 3});
  ASSERT_TRUE(store.ok());
  Tiny model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  ASSERT_TRUE((*store)->Save({4, 0, 4}, model, sgd).ok());
  std::ofstream((*store)->PathFor(8)) << "not a checkpoint";
  auto position = (*store)->LoadLatest(model, sgd);
  ASSERT_TRUE(position.ok()) << position.status();
  ASSERT_TRUE(position->has_value());
  EXPECT_EQ((*position)->step, 4);
}

TEST_F(CheckpointStoreTest, EmptyDirectoryMeansNoCheckpoint) {
  auto store = CheckpointStore::Create({FreshDir("empty"), 2});
  ASSERT_TRUE(store.ok());
  Tiny model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  auto position = (*store)->LoadLatest(model, sgd);
  ASSERT_TRUE(position.ok());
  EXPECT_FALSE(position->has_value());
}

// A write that cannot happen (here the temporary name is taken by a directory, which fails the same
// way for root as a read-only directory does for others) returns an error and leaves the previous
// checkpoint loadable.
TEST_F(CheckpointStoreTest, FailedWriteLeavesThePreviousCheckpoint) {
  auto store = CheckpointStore::Create({FreshDir("failed"), 1});
  ASSERT_TRUE(store.ok());
  Tiny model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  ASSERT_TRUE((*store)->Save({4, 0, 4}, model, sgd).ok());
  ASSERT_EQ(::mkdir(((*store)->PathFor(8) + ".tmp").c_str(), 0755), 0);
  absl::StatusOr<SavedCheckpoint> failed = (*store)->Save({8, 0, 8}, model, sgd);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ((*store)->Steps(), (std::vector<int64_t>{4}));
  auto position = (*store)->LoadLatest(model, sgd);
  ASSERT_TRUE(position.ok() && position->has_value());
  EXPECT_EQ((*position)->step, 4);
}

TEST_F(CheckpointStoreTest, RejectsBadOptions) {
  EXPECT_FALSE(CheckpointStore::Create({"", 2}).ok());
  EXPECT_EQ(CheckpointStore::Create({"/tmp/x", 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Found by tools/fuzz.sh: some damaged files crash LibTorch's reader (SIGSEGV in its TorchScript type
// parser) instead of throwing, which would kill the worker at every resume. The trailer's checksum
// refuses a damaged file before LibTorch sees it, and the older checkpoint is used.
TEST_F(CheckpointStoreTest, ADamagedFileIsRefusedByItsChecksumBeforeLibTorchReadsIt) {
  auto store = CheckpointStore::Create({FreshDir("damaged"), 3});
  ASSERT_TRUE(store.ok());
  Tiny model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  ASSERT_TRUE((*store)->Save({4, 0, 4}, model, sgd).ok());
  ASSERT_TRUE((*store)->Save({8, 0, 8}, model, sgd).ok());
  std::fstream file((*store)->PathFor(8), std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(0, std::ios::end);
  const std::streamoff middle = file.tellg() / 2;
  file.seekg(middle);
  const char byte = static_cast<char>(file.get());
  file.seekp(middle);
  file.put(static_cast<char>(byte ^ 0x5a));
  file.close();

  absl::StatusOr<TrainingPosition> damaged = (*store)->Load(8, model, sgd);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(damaged.status().message(), "checksum mismatch")) << damaged.status();
  auto position = (*store)->LoadLatest(model, sgd);
  ASSERT_TRUE(position.ok()) << position.status();
  ASSERT_TRUE(position->has_value());
  EXPECT_EQ((*position)->step, 4);
}

}  // namespace
}  // namespace fitrun::worker
