#include "worker/models/sasrec.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <vector>

#include "gtest/gtest.h"
#include "worker/models/measured_step_testing.h"

namespace fitrun::worker {
namespace {

constexpr int64_t kItems = 500;

fitrun::v1::SasRecConfig Config(bool activation_checkpointing) {
  fitrun::v1::SasRecConfig config;
  config.set_max_len(50);
  config.set_hidden(64);
  config.set_blocks(4);
  config.set_heads(2);
  config.set_activation_checkpointing(activation_checkpointing);
  return config;
}

MeasuredStep TrainOneStep(bool activation_checkpointing) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateSasRec(Config(activation_checkpointing), kItems, 7);
  EXPECT_TRUE(model.ok()) << model.status();
  at::Generator generator = at::detail::createCPUGenerator(/*seed_val=*/11);
  // Histories with left padding (item 0) on some users, as the MovieLens loader makes them.
  at::Tensor sequences = at::randint(1, kItems + 1, {32, 51}, generator, at::kLong);
  sequences.narrow(0, 0, 8).narrow(1, 0, 20).zero_();
  // The negatives are drawn from the global generator: the same draws in both steps.
  at::manual_seed(3);
  return TrainOneStepCounted(**model, {sequences.narrow(1, 0, 50)}, sequences.narrow(1, 1, 50));
}

TEST(SasRecTest, ActivationCheckpointingGivesThePlainStepsNumbersInLessMemory) {
  const MeasuredStep plain = TrainOneStep(false);
  const MeasuredStep recomputed = TrainOneStep(true);
  ExpectSameNumbers(plain, recomputed);
  EXPECT_LT(recomputed.peak_bytes, plain.peak_bytes * 0.7)
      << "plain " << plain.peak_bytes << " bytes, checkpointed " << recomputed.peak_bytes;
}

TEST(SasRecTest, ActivationCheckpointingChangesNothingWithoutBackward) {
  absl::StatusOr<std::shared_ptr<Model>> plain = CreateSasRec(Config(false), kItems, 3);
  absl::StatusOr<std::shared_ptr<Model>> recomputed = CreateSasRec(Config(true), kItems, 3);
  ASSERT_TRUE(plain.ok() && recomputed.ok());
  const at::Tensor items = at::arange(1, 51, at::kLong).unsqueeze(0);
  (*recomputed)->eval();
  (*plain)->eval();
  EXPECT_TRUE(at::equal((*recomputed)->Forward({items}), (*plain)->Forward({items})));
}

}  // namespace
}  // namespace fitrun::worker
