#include "server/core/specs/job_specs.h"
#include "server/core/specs/job_specs_testing.h"
#include "server/core/specs/workloads.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

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

TEST(JobSpecTest, KeepLastBelowOneIsRejectedAndZeroTakesTheDefault) {
  absl::StatusOr<fitrun::v1::JobSpec> refused = Normalize(std::string(kValidYaml) + "checkpoint: {keep_last: -1}\n");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.checkpoint.keep_last: must be >= 1, or leave it out for the default of 2 (got -1)"));
  absl::StatusOr<fitrun::v1::JobSpec> zero = Normalize(std::string(kValidYaml) + "checkpoint: {keep_last: 0}\n");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->checkpoint().keep_last(), 2);
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

TEST(JobSpecTest, HostMemoryAndMaxProcessesAreReadPerRankWithNamedErrors) {
  auto with = [](const std::string& resources) {
    std::string yaml = kValidYaml;
    yaml.replace(yaml.find("{min_devices: 1, max_devices: 2}"), 32, resources);
    return Normalize(yaml);
  };
  absl::StatusOr<fitrun::v1::JobSpec> spec = with("{max_devices: 2, host_memory: 6GiB, max_processes: 64}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources().host_memory(), "6GiB");
  EXPECT_EQ(spec->resources().max_processes(), 64);
  // Left out: the host memory depends on the device (the launch decides it); 512 tasks per rank.
  spec = with("{max_devices: 2}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources().host_memory(), "");
  EXPECT_EQ(spec->resources().max_processes(), 512);

  for (const auto& [resources, error] : std::vector<std::pair<std::string, std::string>>{
           {"{host_memory: 8GB}", "spec.resources.host_memory: '8GB' is not a size; write a positive number with B, "
                                  "KiB, MiB, GiB or TiB, e.g. 4GiB"},
           {"{host_memory: 8}", "spec.resources.host_memory: '8' is not a size"},
           {"{host_memory: 16MiB}", "spec.resources.host_memory: must be at least 64.0 MiB per rank"},
           {"{host_memory: [1]}", "spec.resources.host_memory: expected a string"},
           {"{max_processes: 4}", "spec.resources.max_processes: must be at least 32 (a rank's own threads count)"},
           {"{max_processes: -1}", "spec.resources.max_processes: must be at least 32"},
       }) {
    EXPECT_THAT(with(resources).status().message(), HasSubstr(error)) << resources;
  }
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

TEST(JobSpecTest, Bf16AndFp16AreSpecsTheDevicesDecideOn) {
  // fp16 needs CUDA devices: the planner, which knows them, refuses it on CPUs (job_manager_gpu_test).
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("precision: fp32"), 15, "precision: bf16");
  EXPECT_TRUE(Normalize(yaml).ok());
  yaml.replace(yaml.find("precision: bf16"), 15, "precision: fp16");
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->precision(), fitrun::v1::PRECISION_FP16);
}

// spec.ddp.comm_hook: PyTorch's DDP communication hooks by name, PowerSGD's knobs with
// PowerSGDState's defaults, and every refusal naming the field and what would be accepted.
TEST(JobSpecTest, CommHookDefaultsToNoneAndTakesPyTorchsHooks) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(kValidYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ddp().comm_hook(), fitrun::v1::COMM_HOOK_NONE);
  EXPECT_FALSE(spec->ddp().has_powersgd_rank());
  EXPECT_FALSE(spec->ddp().has_powersgd_start_iter());

  for (const auto& [name, hook] : std::vector<std::pair<std::string, fitrun::v1::CommHook>>{
           {"none", fitrun::v1::COMM_HOOK_NONE},
           {"fp16", fitrun::v1::COMM_HOOK_FP16},
           {"bf16", fitrun::v1::COMM_HOOK_BF16},
           {"powersgd", fitrun::v1::COMM_HOOK_POWERSGD}}) {
    spec = Normalize(std::string(kValidYaml) + "ddp: {bucket_cap_mb: 4, comm_hook: " + name + "}\n");
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->ddp().comm_hook(), hook) << name;
    EXPECT_DOUBLE_EQ(spec->ddp().bucket_cap_mb(), 4);
  }
  // PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=1_000).
  EXPECT_EQ(spec->ddp().powersgd_rank(), 1);
  EXPECT_EQ(spec->ddp().powersgd_start_iter(), 1000);

  spec = Normalize(std::string(kValidYaml) +
                   "ddp: {comm_hook: powersgd, powersgd_rank: 4, powersgd_start_iter: 2}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ddp().powersgd_rank(), 4);
  EXPECT_EQ(spec->ddp().powersgd_start_iter(), 2);
}

TEST(JobSpecTest, CommHookErrorsNameTheFieldAndTheAllowedValues) {
  const auto error = [](const std::string& ddp) {
    return std::string(Normalize(std::string(kValidYaml) + "ddp: " + ddp + "\n").status().message());
  };
  EXPECT_THAT(error("{comm_hook: int8}"),
              HasSubstr("spec.ddp.comm_hook: unknown value 'int8' (line 10); use one of: none, fp16, bf16, powersgd"));
  EXPECT_THAT(error("{comm_hook: powersgd, powersgd_start_iter: 1}"),
              HasSubstr("spec.ddp.powersgd_start_iter: must be >= 2 (got 1)"));
  EXPECT_THAT(error("{comm_hook: powersgd, powersgd_start_iter: 1}"),
              HasSubstr("PyTorch's PowerSGDState requires start_powerSGD_iter > 1"));
  EXPECT_THAT(error("{comm_hook: powersgd, powersgd_start_iter: 0}"),
              HasSubstr("spec.ddp.powersgd_start_iter: must be >= 2 (got 0)"));
  EXPECT_THAT(error("{comm_hook: powersgd, powersgd_rank: 0}"),
              HasSubstr("spec.ddp.powersgd_rank: must be >= 1 (got 0)"));
  EXPECT_THAT(error("{comm_hook: powersgd, powersgd_rank: -3}"),
              HasSubstr("spec.ddp.powersgd_rank: must be >= 1 (got -3)"));
  EXPECT_THAT(error("{comm_hook: powersgd, powersgd_rank: two}"),
              HasSubstr("spec.ddp.powersgd_rank: expected an integer, got 'two'"));
  EXPECT_THAT(error("{comm_hook: fp16, powersgd_rank: 2}"),
              HasSubstr("spec.ddp.powersgd_rank: only used with comm_hook: powersgd (got comm_hook: fp16)"));
  EXPECT_THAT(error("{powersgd_start_iter: 100}"),
              HasSubstr("spec.ddp.powersgd_start_iter: only used with comm_hook: powersgd (got comm_hook: none)"));

  // Through the API, where no YAML names the enum.
  absl::StatusOr<fitrun::v1::JobSpec> parsed = ParseJobSpecYaml(kValidYaml);
  ASSERT_TRUE(parsed.ok());
  parsed->mutable_ddp()->set_comm_hook(static_cast<fitrun::v1::CommHook>(9));
  EXPECT_THAT(std::string(NormalizeJobSpec(*parsed).status().message()),
              HasSubstr("spec.ddp.comm_hook: unknown value 9; use one of: none, fp16, bf16, powersgd"));
}

TEST(JobSpecTest, ZeroStageIsZeroOrOneAndLeftOutByDefault) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(std::string(kValidYaml));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->ddp().has_zero_stage());  // the planner chooses
  for (int stage : {0, 1}) {
    spec = Normalize(std::string(kValidYaml) + "ddp: {zero_stage: " + std::to_string(stage) + "}\n");
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_TRUE(spec->ddp().has_zero_stage());
    EXPECT_EQ(spec->ddp().zero_stage(), stage);
  }
  EXPECT_THAT(std::string(Normalize(std::string(kValidYaml) + "ddp: {zero_stage: 2}\n").status().message()),
              HasSubstr("spec.ddp.zero_stage: must be 0 (every rank keeps all optimizer states) or 1"));
}

TEST(JobSpecTest, InvalidYamlSaysWhere) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = ParseJobSpecYaml("name: [unclosed\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("not valid YAML at line"));
}

}  // namespace
}  // namespace fitrun::server
