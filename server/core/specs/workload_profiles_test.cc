#include "server/core/specs/workload_profiles.h"
#include "server/core/specs/workloads.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

// The spec with what its checks read of its files (as admission records it at submit).
absl::StatusOr<fitrun::v1::JobSpec> Admitted(fitrun::v1::JobSpec spec) {
  fitrun::v1::SpecFileFacts facts;
  if (absl::Status valid = ValidateModelAndData(spec, &facts); !valid.ok()) return valid;
  *spec.mutable_file_facts() = facts;
  return spec;
}

fitrun::v1::JobSpec GptSpec(const std::string& path, bool tied) {
  fitrun::v1::JobSpec spec;
  spec.mutable_model()->set_builtin("gpt");
  fitrun::v1::GptConfig* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_layers(2);
  gpt->set_heads(4);
  gpt->set_hidden(128);
  gpt->set_context(64);
  gpt->set_tied_head(tied);
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_TEXT);
  spec.mutable_data()->set_path(path);
  return spec;
}

TEST(ModelProfileTest, GptCountsParametersActivationsAndWindows) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Write("corpus.txt", std::string(10000, 'x'));
  absl::StatusOr<ModelProfile> untied = ProfileFor(*Admitted(GptSpec(path, false)));
  ASSERT_TRUE(untied.ok()) << untied.status();
  // Embeddings 256*128 + 64*128, two blocks of 12*128^2 + 13*128, the final LayerNorm, the head.
  EXPECT_EQ(untied->parameter_count, 256 * 128 + 64 * 128 + 2 * (12 * 128 * 128 + 13 * 128) + 256 + 256 * 128);
  absl::StatusOr<ModelProfile> tied = ProfileFor(*Admitted(GptSpec(path, true)));
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_EQ(untied->parameter_count - tied->parameter_count, 256 * 128);
  // Per layer 2 * (s*h*34 + 5*a*s^2) bytes (fp32), plus embeddings and logits.
  const int64_t layer = 2 * (64 * 128 * 34 + 5 * 4 * 64 * 64);
  EXPECT_EQ(untied->activation_bytes_per_sample, 2 * layer + 2 * 64 * 128 * 4 + 3 * 64 * 256 * 4);
  // Checkpointed: each layer keeps its input (s*h floats), and one layer's activations are recomputed.
  fitrun::v1::JobSpec checkpointed_spec = GptSpec(path, false);
  checkpointed_spec.mutable_model()->mutable_gpt()->set_activation_checkpointing(true);
  absl::StatusOr<ModelProfile> checkpointed = ProfileFor(*Admitted(checkpointed_spec));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  EXPECT_EQ(checkpointed->activation_bytes_per_sample,
            2 * 64 * 128 * 4 + layer + 2 * 64 * 128 * 4 + 3 * 64 * 256 * 4);
  EXPECT_EQ(checkpointed->parameter_count, untied->parameter_count);
  EXPECT_EQ(untied->input_bytes_per_sample, 128);
  // The first 9000 bytes in windows of 65 every 64: floor(8999 / 64).
  EXPECT_EQ(untied->train_samples, 140);
}

// What recomputing adds to a step: the blocks' forward (2 FLOPs a weight and 4*s*h of attention per
// token a layer) over three forwards of the whole model (the head: 2*V*h).
TEST(ModelProfileTest, RecomputingAddsOneForwardOfTheBlocks) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Write("corpus-recompute.txt", std::string(10000, 'x'));
  absl::StatusOr<ModelProfile> gpt = ProfileFor(*Admitted(GptSpec(path, false)));
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  const double blocks = 2.0 * (2 * 12 * 128 * 128 + 4 * 64 * 128);
  EXPECT_NEAR(gpt->recompute_share, blocks / (3 * (blocks + 2 * 256 * 128)), 1e-12);
  EXPECT_FALSE(gpt->activation_checkpointing);
}

TEST(WorkloadsTest, RecomputingIsTheSpecsCallWhenItSetsItAndThePlansOtherwise) {
  fitrun::v1::JobSpec gpt = GptSpec("/corpus.txt", false);
  EXPECT_TRUE(CanCheckpointActivations(gpt));
  EXPECT_EQ(SpecActivationCheckpointing(gpt), std::nullopt);
  EXPECT_EQ(SpecActivationCheckpointing(WithActivationCheckpointing(gpt, true)), true);
  EXPECT_EQ(SpecActivationCheckpointing(WithActivationCheckpointing(gpt, false)), false);
  fitrun::v1::Plan plan;
  plan.set_activation_checkpointing(true);
  EXPECT_TRUE(SpecAsPlanned(gpt, plan).model().gpt().activation_checkpointing());
  plan.set_activation_checkpointing(false);
  EXPECT_TRUE(SpecAsPlanned(gpt, plan).model().gpt().has_activation_checkpointing());
  EXPECT_FALSE(SpecAsPlanned(gpt, plan).model().gpt().activation_checkpointing());

  fitrun::v1::JobSpec mlp;
  mlp.mutable_model()->set_builtin("mlp");
  EXPECT_FALSE(CanCheckpointActivations(mlp));
  EXPECT_EQ(SpecActivationCheckpointing(mlp), false);
  plan.set_activation_checkpointing(true);
  EXPECT_EQ(SpecAsPlanned(mlp, plan).SerializeAsString(), mlp.SerializeAsString());
}

TEST(ModelProfileTest, SasRecScansTheRatingsForItemsAndUsers) {
  // Users 1 and 2 have three ratings (samples); user 3 has two (too few to train on). Four items.
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Write("ratings.dat",
                                         "1::10::5::1\n1::11::3::2\n1::12::4::3\n"
                                         "2::10::5::1\n2::13::3::2\n2::11::1::3\n"
                                         "3::12::2::1\n3::13::2::2\n");
  fitrun::v1::JobSpec spec;
  spec.mutable_model()->set_builtin("sasrec");
  fitrun::v1::SasRecConfig* sasrec = spec.mutable_model()->mutable_sasrec();
  sasrec->set_max_len(50);
  sasrec->set_hidden(64);
  sasrec->set_blocks(2);
  sasrec->set_heads(1);
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_MOVIELENS);
  spec.mutable_data()->set_path(path);
  absl::StatusOr<fitrun::v1::JobSpec> admitted = Admitted(spec);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  absl::StatusOr<ModelProfile> profile = ProfileFor(*admitted);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->parameter_count, 5 * 64 + 50 * 64 + 2 * (6 * 64 * 64 + 10 * 64) + 128);
  EXPECT_EQ(profile->train_samples, 2);
  // Per block 2 * (s*h*34 + 5*a*s^2) bytes, plus the embeddings; checkpointed, each block keeps its
  // input and one block's activations are recomputed.
  const int64_t block = 2 * (50 * 64 * 34 + 5 * 1 * 50 * 50);
  EXPECT_EQ(profile->activation_bytes_per_sample, 2 * block + 6 * 50 * 64 * 4);
  sasrec->set_activation_checkpointing(true);
  absl::StatusOr<ModelProfile> checkpointed = ProfileFor(*Admitted(spec));
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  EXPECT_EQ(checkpointed->activation_bytes_per_sample, 2 * 50 * 64 * 4 + block + 6 * 50 * 64 * 4);
  sasrec->set_activation_checkpointing(false);

  spec.mutable_data()->set_path(dir.Write("bad.dat", "1::10::5::1\nnot a rating\n"));
  EXPECT_THAT(Admitted(spec).status().message(), HasSubstr("line 2 is not user::item::rating::timestamp"));
  spec.mutable_data()->set_path(dir.Write("long.dat", std::string(5000, '1') + "\n"));
  EXPECT_THAT(Admitted(spec).status().message(), HasSubstr("line 1 is longer than 4096 bytes"));
}

TEST(ModelProfileTest, PlansUseWhatWasReadAtSubmitAndNeverOpenTheFilesAgain) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Write("swapped.txt", std::string(10000, 'x'));
  absl::StatusOr<fitrun::v1::JobSpec> admitted = Admitted(GptSpec(path, false));
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_THAT(admitted->file_facts().versions().at(path), HasSubstr(path + "@"));
  // The owner swaps the file for a FIFO after submit: profiles still come from the facts, at once.
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  absl::StatusOr<ModelProfile> profile = ProfileFor(*admitted);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->train_samples, 140);
  // A FIFO named at submit is refused, not waited on.
  absl::StatusOr<fitrun::v1::JobSpec> fifo = Admitted(GptSpec(path, false));
  EXPECT_THAT(fifo.status().message(), HasSubstr("is a FIFO"));
  // A spec that never went through admission has no facts to plan with, and says so.
  EXPECT_THAT(ProfileFor(GptSpec(path, false)).status().message(), HasSubstr("spec.file_facts is empty"));
}

TEST(ModelProfileTest, TorchScriptIsBoundedByItsFileSize) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  fitrun::v1::JobSpec spec;
  spec.mutable_model()->set_torchscript(dir.Write("model.pt", std::string(4000, '\0')));
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
  absl::StatusOr<fitrun::v1::JobSpec> admitted = Admitted(spec);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  absl::StatusOr<ModelProfile> profile = ProfileFor(*admitted);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->parameter_count, 1000);
  EXPECT_EQ(profile->train_samples, 60000);
  spec.mutable_model()->set_torchscript("/nonexistent/model.pt");
  EXPECT_THAT(Admitted(spec).status().message(), HasSubstr("spec.model.torchscript"));
}

}  // namespace
}  // namespace fitrun::server
