#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <string>

#include "gtest/gtest.h"
#include "proto/contract/testing/temp_dir.h"
#include "worker/checkpoint/checkpoint_store.h"
#include "worker/memory/capped_allocator.h"

namespace fitrun::worker {
namespace {

struct Wide : torch::nn::Module {
  Wide() { w = register_parameter("w", at::randn({256, 256})); }
  at::Tensor w;
};

// A device that cannot hold the checkpoint's tensors is an OOM for the rank to report, not a
// damaged file to skip for an older one (which would not fit either).
TEST(CheckpointOomTest, LoadingOntoAFullDeviceIsResourceExhausted) {
  const contract::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = CheckpointStore::Create({dir.Join("oom"), 2});
  ASSERT_TRUE(store.ok()) << store.status();
  Wide model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
  ASSERT_TRUE((*store)->Save({4, 0, 4}, model, sgd).ok());
  ASSERT_TRUE((*store)->Save({8, 0, 8}, model, sgd).ok());

  CappedCpuAllocator device(/*cap_bytes=*/64 << 10);  // the file's 256 KiB tensor does not fit
  device.Install();
  absl::StatusOr<TrainingPosition> loaded = (*store)->Load(8, model, sgd);
  absl::StatusOr<std::optional<TrainingPosition>> latest = (*store)->LoadLatest(model, sgd);
  device.Uninstall();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kResourceExhausted) << loaded.status();
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kResourceExhausted) << latest.status();
}

}  // namespace
}  // namespace fitrun::worker
