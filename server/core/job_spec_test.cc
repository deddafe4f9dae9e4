#include "server/core/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

constexpr char kValidYaml[] = R"(
name: fashion-mnist-mlp
model: {builtin: mlp}
data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9, lr_scaling: none}
global_batch_size: 256
epochs: 1
precision: fp32
resources: {min_devices: 1, max_devices: 2}
)";

absl::StatusOr<fitrun::v1::JobSpec> Normalize(const std::string& yaml) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  if (!spec.ok()) return spec.status();
  return NormalizeJobSpec(*spec);
}

TEST(JobSpecTest, TheDocumentedExampleParsesIntoEveryField) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(kValidYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fashion-mnist-mlp");
  EXPECT_EQ(spec->model().builtin(), "mlp");
  EXPECT_EQ(spec->data().kind(), fitrun::v1::DATA_KIND_FASHION_MNIST);
  EXPECT_EQ(spec->optimizer().kind(), fitrun::v1::OPTIMIZER_KIND_SGD);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.05);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_EQ(spec->global_batch_size(), 256);
  EXPECT_EQ(spec->epochs(), 1);
  EXPECT_EQ(spec->resources().max_devices(), 2);
}

TEST(JobSpecTest, DefaultsAreFilledIn) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(kValidYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().reference_batch_size(), 256);
  EXPECT_DOUBLE_EQ(spec->resources().memory_headroom(), 0.1);
  EXPECT_DOUBLE_EQ(spec->ddp().bucket_cap_mb(), 25);
  EXPECT_EQ(spec->ddp().collective_timeout_seconds(), 60);
  EXPECT_EQ(spec->checkpoint().keep_last(), 2);
}

TEST(JobSpecTest, UnknownTopLevelFieldIsNamed) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(std::string(kValidYaml) + "learning_rate: 0.1\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.learning_rate: unknown field"));
  EXPECT_THAT(spec.status().message(), HasSubstr("known fields:"));
}

TEST(JobSpecTest, UnknownNestedFieldIsNamedWithItsPath) {
  absl::StatusOr<fitrun::v1::JobSpec> spec =
      Normalize("name: x\noptimizer: {kind: sgd, lr: 0.1, nesterov: true}\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.optimizer.nesterov: unknown field"));
}

TEST(JobSpecTest, WrongTypeIsNamed) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("global_batch_size: 256"), 22, "global_batch_size: lots");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.global_batch_size: expected an integer, got 'lots'"));
}

TEST(JobSpecTest, NegativeBatchIsRejected) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("global_batch_size: 256"), 22, "global_batch_size: -8");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.global_batch_size: must be a positive number"));
}

TEST(JobSpecTest, MissingDataPathIsRejected) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find(", path: /usr/share/datasets/fashion-mnist"), 41, "");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.data.path: required"));
}

TEST(JobSpecTest, DataPathThatDoesNotExistIsRejected) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("/usr/share/datasets/fashion-mnist"), 33, "/nonexistent/fm");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.data.path: no directory '/nonexistent/fm'"));
}

TEST(JobSpecTest, UnknownEnumValueListsTheChoices) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("kind: sgd"), 9, "kind: lion");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.optimizer.kind: unknown value 'lion'"));
  EXPECT_THAT(spec.status().message(), HasSubstr("sgd, adam, adamw"));
}

TEST(JobSpecTest, MaxDevicesBelowMinDevicesIsRejected) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("{min_devices: 1, max_devices: 2}"), 32, "{min_devices: 2, max_devices: 1}");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.resources.max_devices: must be >= min_devices (got 1 < 2)"));
}

TEST(JobSpecTest, UnknownModelIsRejected) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("builtin: mlp"), 12, "builtin: resnet");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.model.builtin: unknown model 'resnet'"));
}

TEST(JobSpecTest, TrainingLengthIsRequired) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("epochs: 1"), 9, "epochs: 0");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.epochs: set epochs or max_steps"));
}

TEST(JobSpecTest, InvalidYamlSaysWhere) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = ParseJobSpecYaml("name: [unclosed\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("not valid YAML at line"));
}

}  // namespace
}  // namespace fitrun::server
