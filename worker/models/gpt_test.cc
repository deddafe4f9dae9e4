#include "worker/models/gpt.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/models/measured_step_testing.h"

namespace fitrun::worker {
namespace {

fitrun::v1::GptConfig Config(int layers, int heads, int hidden, int context, bool tied = false) {
  fitrun::v1::GptConfig config;
  config.set_layers(layers);
  config.set_heads(heads);
  config.set_hidden(hidden);
  config.set_context(context);
  config.set_tied_head(tied);
  return config;
}

int64_t CountParameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters()) n += p.numel();
  return n;
}

TEST(GptTest, ParameterCountMatchesTheFormulaTiedAndUntied) {
  for (bool tied : {false, true}) {
    const fitrun::v1::GptConfig config = Config(2, 4, 32, 16, tied);
    absl::StatusOr<std::shared_ptr<Model>> model = CreateGpt(config, 1);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(CountParameters(**model), GptParameterCount(config)) << "tied " << tied;
  }
  // By hand for one config: embeddings 256*32 + 16*32, 2 blocks of 12*32^2 + 13*32, final norm, head.
  EXPECT_EQ(GptParameterCount(Config(2, 4, 32, 16)), 256 * 32 + 16 * 32 + 2 * (12 * 1024 + 13 * 32) + 64 + 256 * 32);
  EXPECT_EQ(GptParameterCount(Config(2, 4, 32, 16, true)), GptParameterCount(Config(2, 4, 32, 16)) - 256 * 32);
}

TEST(GptTest, LogitsAreCausal) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateGpt(Config(2, 2, 16, 8), 3);
  ASSERT_TRUE(model.ok()) << model.status();
  at::Tensor input = at::randint(0, 256, {1, 8}, at::kLong);
  const at::Tensor before = (*model)->Forward({input});
  EXPECT_EQ(before.sizes(), (at::IntArrayRef{1, 8, 256}));
  input[0][5] = (input[0][5].item<int64_t>() + 1) % 256;
  const at::Tensor after = (*model)->Forward({input});
  // Positions before the changed byte cannot see it; the changed position and later ones do.
  EXPECT_TRUE(at::allclose(before.narrow(1, 0, 5), after.narrow(1, 0, 5)));
  EXPECT_FALSE(at::allclose(before.narrow(1, 5, 1), after.narrow(1, 5, 1)));
}

TEST(GptTest, AnUntrainedModelIsNearUniform) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateGpt(Config(1, 2, 16, 8), 3);
  ASSERT_TRUE(model.ok()) << model.status();
  const at::Tensor inputs = at::randint(0, 256, {4, 8}, at::kByte);
  const at::Tensor targets = at::randint(0, 256, {4, 8}, at::kByte);
  // ln(256) = 5.545 nats: small initial weights give nearly uniform next-byte predictions.
  EXPECT_NEAR((*model)->Loss({inputs}, targets).item<double>(), std::log(256.0), 0.1);
}

MeasuredStep TrainOneStep(bool activation_checkpointing) {
  fitrun::v1::GptConfig config = Config(4, 4, 64, 64);
  config.set_activation_checkpointing(activation_checkpointing);
  absl::StatusOr<std::shared_ptr<Model>> model = CreateGpt(config, 7);
  EXPECT_TRUE(model.ok()) << model.status();
  at::Generator generator = at::detail::createCPUGenerator(/*seed_val=*/11);
  const at::Tensor windows = at::randint(0, 256, {16, 65}, generator, at::kLong);
  return TrainOneStepCounted(**model, {windows.narrow(1, 0, 64)}, windows.narrow(1, 1, 64));
}

TEST(GptTest, ActivationCheckpointingGivesThePlainStepsNumbersInLessMemory) {
  const MeasuredStep plain = TrainOneStep(false);
  const MeasuredStep recomputed = TrainOneStep(true);
  ExpectSameNumbers(plain, recomputed);
  // 4 blocks, each keeping about 20 activations of 16 x 64 x 64 floats (and 4 attention maps of 64 x 64
  // per window) in the plain step; checkpointed, the block inputs and one block's at a time.
  EXPECT_LT(recomputed.peak_bytes, plain.peak_bytes * 0.6)
      << "plain " << plain.peak_bytes << " bytes, checkpointed " << recomputed.peak_bytes;
}

TEST(GptTest, ActivationCheckpointingChangesNothingWithoutBackward) {
  fitrun::v1::GptConfig config = Config(2, 2, 16, 8);
  absl::StatusOr<std::shared_ptr<Model>> plain = CreateGpt(config, 3);
  config.set_activation_checkpointing(true);
  absl::StatusOr<std::shared_ptr<Model>> recomputed = CreateGpt(config, 3);
  ASSERT_TRUE(plain.ok() && recomputed.ok());
  const at::Tensor tokens = at::arange(8, at::kLong).unsqueeze(0);
  (*recomputed)->eval();
  (*plain)->eval();
  EXPECT_TRUE(at::equal((*recomputed)->Forward({tokens}), (*plain)->Forward({tokens})));
}

TEST(GptTest, InvalidConfigsNameTheField) {
  absl::Status heads = ValidateGptConfig(Config(2, 3, 32, 16));
  EXPECT_EQ(heads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(heads.message(), "spec.model.gpt.heads")) << heads;
  EXPECT_TRUE(absl::StrContains(ValidateGptConfig(Config(0, 1, 32, 16)).message(), "spec.model.gpt.layers"));
  EXPECT_TRUE(absl::StrContains(ValidateGptConfig(Config(1, 1, 32, 0)).message(), "spec.model.gpt.context"));
  EXPECT_FALSE(CreateGpt(Config(2, 3, 32, 16), 1).ok());
}

}  // namespace
}  // namespace fitrun::worker
