#include "server/core/memory/planner.h"
#include "server/core/specs/workloads.h"

#include <gmock/gmock.h>

#include <memory>
#include <set>

#include "absl/strings/str_join.h"
#include <gtest/gtest.h>

#include "server/core/specs/job_specs.h"
#include "server/core/memory/planner_testing.h"
#include "server/core/specs/test_specs.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

TEST(PlannerTest, UsesEveryAllowedDeviceAndTheWholeBatchWhenItFits) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 2);
  EXPECT_EQ(plan->per_device_batch(), 128);
  EXPECT_EQ(plan->grad_accum_steps(), 1);
  EXPECT_EQ(plan->steps_per_epoch(), 60000 / 256);
  EXPECT_EQ(plan->total_steps(), 234);
  EXPECT_FALSE(plan->reasons().empty());
}

TEST(PlannerTest, MaxDevicesCapsTheDeviceCount) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 1);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(4, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 1);
  EXPECT_EQ(plan->per_device_batch(), 256);
}

TEST(PlannerTest, TheCoordinatorsDeviceBoundTakesFewerDevicesOrWaits) {
  const fitrun::v1::JobSpec spec = MlpSpec(256, 1, 4);
  PlanLimits limits;
  limits.max_devices = 2;
  limits.max_devices_reason = "their ranks' host memory must fit in the host's";
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(4, 4096 * kMiB), {}, limits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 2);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("at most 2 now: their ranks' host memory"));
  // Below the spec's minimum: wait (UNAVAILABLE), saying why.
  limits.max_devices = 0;
  plan = PlanJob(spec, Profile(spec), Devices(4, 4096 * kMiB), {}, limits);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(plan.status().message(), HasSubstr("host memory"));
}

TEST(PlannerTest, ABuiltInJobTakesOneSliceOfEachGpuAndAScriptMayShareOne) {
  // Two slices of one GPU and a whole second GPU.
  std::vector<DeviceCapacity> gpus;
  for (const char* id : {"cuda:0#0", "cuda:0#1", "cuda:1"}) {
    DeviceCapacity device{id, 4096 * kMiB};
    device.gpu_model = "NVIDIA H100 80GB HBM3";
    gpus.push_back(device);
  }
  fitrun::v1::JobSpec builtin = MlpSpec(384, 2, 3);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(builtin, Profile(builtin), gpus);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 2);
  EXPECT_NE(GpuOf(gpus[0]), "");
  const std::set<std::string> used = {plan->device_ids(0).substr(0, 6), plan->device_ids(1).substr(0, 6)};
  EXPECT_EQ(used, (std::set<std::string>{"cuda:0", "cuda:1"})) << "one rank per GPU";
  builtin.mutable_resources()->set_min_devices(3);
  EXPECT_THAT(PlanJob(builtin, Profile(builtin), gpus).status().message(), HasSubstr("NCCL refuses them"));
  // A script's own PyTorch has Gloo, which carries CUDA tensors between ranks on one GPU.
  fitrun::v1::JobSpec script = builtin;
  script.clear_model();
  script.clear_data();
  script.mutable_script()->add_command("/usr/bin/python3");
  ModelProfile measured = Profile(builtin);
  plan = PlanJob(script, measured, gpus);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 3);
}

TEST(PlannerTest, SmallDevicesGetASmallerBatchAndAccumulation) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  spec.mutable_ddp()->set_zero_stage(0);  // sharded momentum would fit 64 (PlannerShardingTest)
  const ModelProfile model = Profile(spec);
  // Room for a batch of 32 but not 64, after the 10% headroom.
  const int64_t needed_for_32 = EstimateRankMemory(model, spec, 32).total_bytes();
  const int64_t needed_for_64 = EstimateRankMemory(model, spec, 64).total_bytes();
  const int64_t free_bytes = static_cast<int64_t>((needed_for_32 + needed_for_64) / 2 / 0.9);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, Devices(2, free_bytes));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 32);
  EXPECT_EQ(plan->grad_accum_steps(), 4);
  EXPECT_EQ(plan->device_ids_size() * plan->per_device_batch() * plan->grad_accum_steps(), 256);
  EXPECT_LE(plan->predicted().total_bytes(), static_cast<int64_t>(free_bytes * 0.9));
}

TEST(PlannerTest, AScriptThatMustAccumulateIsToldHow) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  const ModelProfile model = Profile(spec);
  const int64_t free_bytes = static_cast<int64_t>(EstimateRankMemory(model, spec, 40).total_bytes() / 0.9);
  spec.mutable_script()->add_command("/usr/bin/python3");
  spec.mutable_script()->add_command("train.py");
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, Devices(2, free_bytes));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->grad_accum_steps(), 4);
  std::string reasons;
  for (const std::string& r : plan->reasons()) reasons += r + "\n";
  EXPECT_THAT(reasons, HasSubstr("the script must accumulate gradients over 4 micro-batches per optimizer step "
                                 "(FITRUN_GRAD_ACCUM_STEPS); one that does not trains on a global batch of 64 "
                                 "(spec.script.grad_accum_flag passes it as a flag)"));
  spec.mutable_script()->set_grad_accum_flag("--accum");
  reasons.clear();
  plan = PlanJob(spec, model, Devices(2, free_bytes));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const std::string& r : plan->reasons()) reasons += r + "\n";
  EXPECT_THAT(reasons, HasSubstr("(FITRUN_GRAD_ACCUM_STEPS, or --accum); one that does not trains on a global batch of 64\n"));
}

// A script nothing has measured: the plan takes every device and the largest batch the spec
// allows, however small the devices, predicts no peak and says that its first steps measure it;
// below a batch that ran out of memory, the largest divisor under it.
TEST(PlannerTest, AnUnmeasuredScriptTakesTheLargestBatchAndPredictsNothing) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  spec.clear_model();
  spec.mutable_script()->add_command("train.py");
  const ModelProfile model = Profile(spec);
  ASSERT_TRUE(model.Unmeasured());
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, Devices(2, 1 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 2);
  EXPECT_EQ(plan->per_device_batch(), 128);
  EXPECT_EQ(plan->predicted().total_bytes(), 0);
  EXPECT_THAT(absl::StrJoin(plan->reasons(), "\n"), HasSubstr("its first steps measure its peak"));
  PlanLimits below;
  below.max_per_device_batch = 100;
  plan = PlanJob(spec, model, Devices(2, 1 * kMiB), {}, below);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 64);
  EXPECT_EQ(plan->grad_accum_steps(), 2);
}

TEST(PlannerTest, TheBatchIsAlwaysADivisorSoTheGlobalBatchIsExact) {
  fitrun::v1::JobSpec spec = MlpSpec(96, 1, 1);
  const ModelProfile model = Profile(spec);
  // Room for 40 samples: the largest divisor of 96 that fits is 32.
  const int64_t free_bytes = static_cast<int64_t>(EstimateRankMemory(model, spec, 40).total_bytes() / 0.9);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, model, Devices(1, free_bytes));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 32);
  EXPECT_EQ(plan->grad_accum_steps(), 3);
}

TEST(PlannerTest, FewerDevicesWhenTheBatchDoesNotSplit) {
  fitrun::v1::JobSpec spec = MlpSpec(250, 1, 3);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(3, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 2);
  EXPECT_THAT(plan->reasons(0), HasSubstr("not 3 devices: global batch 250 does not split evenly"));
}

TEST(PlannerTest, FixedPerDeviceBatchIsHonoured) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  spec.mutable_resources()->set_per_device_batch(16);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 16);
  EXPECT_EQ(plan->grad_accum_steps(), 8);
}

TEST(PlannerTest, FixedPerDeviceBatchThatDoesNotDivideIsAnError) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  spec.mutable_resources()->set_per_device_batch(48);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("spec.resources.per_device_batch"));
}

TEST(PlannerTest, NothingFitsSaysWhatIsNeeded) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 8 * kMiB));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("even per-device batch 1 needs"));
}

// A calibrated profile whose activations dominate: 1 MiB fixed, 10 MiB per sample.
ModelProfile ActivationHeavy(const fitrun::v1::JobSpec& spec) {
  ModelProfile p = Profile(spec);
  p.parameter_count = 1000;
  p.measured = MemoryCurve({{1, 11 * kMiB}, {256, 2561 * kMiB}});
  return p;
}

TEST(PlannerTest, NothingFitsNamesTheSmallestBatchAndBf16) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  // Batch 1 needs 11 MiB * 1.03; 12 MiB less 10% headroom is 10.8 MiB. bf16's activations (~0.6x) fit.
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, ActivationHeavy(spec), Devices(2, 12 * kMiB));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("what would fit: per-device batch 1 (the smallest) needs 11.3 MiB"));
  EXPECT_THAT(plan.status().message(), HasSubstr("devices with 12.6 MiB free each"));
  EXPECT_THAT(plan.status().message(), HasSubstr("spec.precision: bf16, estimated at about 7.2 MiB for per-device batch 1"));

  spec.set_precision(fitrun::v1::PRECISION_BF16);
  plan = PlanJob(spec, ActivationHeavy(spec), Devices(2, 12 * kMiB));
  EXPECT_THAT(plan.status().message(), ::testing::Not(HasSubstr("spec.precision: bf16")));
}

TEST(PlannerTest, NothingFitsOnEnoughDevicesSuggestsFewer) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  const std::vector<DeviceCapacity> devices = {{"cpu:0", 64 * kMiB}, {"cpu:1", 8 * kMiB}};
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, ActivationHeavy(spec), devices);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("fewer devices: 1 device(s) (cpu:0) fit batch 1, so spec.resources.min_devices: 1"));
}

TEST(PlannerTest, TooFewFreeDevicesIsUnavailable) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(1, 4096 * kMiB));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnavailable);
}

TEST(PlannerTest, RoomiestDevicesAreChosenFirst) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 1);
  std::vector<DeviceCapacity> devices = {{"cpu:0", 512 * kMiB}, {"cpu:1", 2048 * kMiB}};
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), devices);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids(0), "cpu:1");
}

TEST(PlannerTest, LearningRateScaling) {
  fitrun::v1::OptimizerSpec optimizer;
  optimizer.set_lr(0.1);
  optimizer.set_reference_batch_size(256);
  optimizer.set_lr_scaling(fitrun::v1::LR_SCALING_NONE);
  EXPECT_DOUBLE_EQ(ScaledLearningRate(optimizer, 1024), 0.1);
  optimizer.set_lr_scaling(fitrun::v1::LR_SCALING_LINEAR);
  EXPECT_DOUBLE_EQ(ScaledLearningRate(optimizer, 1024), 0.4);
  optimizer.set_lr_scaling(fitrun::v1::LR_SCALING_SQRT);
  EXPECT_DOUBLE_EQ(ScaledLearningRate(optimizer, 1024), 0.2);
}

TEST(PlannerTest, MaxStepsOverridesEpochs) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  spec.set_max_steps(7);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->total_steps(), 7);
}

TEST(PlannerTest, LimitAfterOutOfMemoryKeepsTheGlobalBatchWithMoreAccumulation) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 2, 2);
  absl::StatusOr<fitrun::v1::Plan> unbounded = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB));
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  ASSERT_EQ(unbounded->per_device_batch(), 128);

  PlanLimits limits;
  limits.max_per_device_batch = 127;  // 128 ran out of memory
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB), {}, limits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->per_device_batch(), 64);
  EXPECT_EQ(plan->grad_accum_steps(), 2);
  EXPECT_EQ(plan->device_ids_size() * plan->per_device_batch() * plan->grad_accum_steps(), 256);
  EXPECT_THAT(plan->reasons(1), HasSubstr("ran out of memory"));
}

TEST(PlannerTest, NoBatchUnderTheLimitFallsBackToFewerDevicesThenFails) {
  fitrun::v1::JobSpec spec = MlpSpec(2, 1, 2);  // one sample per device per step on 2 devices
  PlanLimits limits;
  limits.max_per_device_batch = 1;
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB), {}, limits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 2);
  EXPECT_EQ(plan->per_device_batch(), 1);
}

// Devices of a cluster: `per_node` on each of `nodes` nodes n1.., named "n1/cpu:0".
std::vector<DeviceCapacity> NodeDevices(int nodes, int per_node, int64_t bytes) {
  std::vector<DeviceCapacity> out;
  for (int node = 1; node <= nodes; ++node) {
    for (int i = 0; i < per_node; ++i) {
      out.push_back({"n" + std::to_string(node) + "/cpu:" + std::to_string(i), bytes, "n" + std::to_string(node)});
    }
  }
  return out;
}

TEST(PlannerNodesTest, OneMachinePlansNameNoNodes) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 2);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), Devices(2, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->nodes_size(), 0);
  EXPECT_EQ(plan->devices_per_node(), 0);
}

TEST(PlannerNodesTest, FillsWholeNodesFirst) {
  // 4 devices fit on one node of four: one node, not two halves.
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 4);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), NodeDevices(3, 4, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->nodes(), ::testing::ElementsAre("n1"));
  EXPECT_EQ(plan->devices_per_node(), 4);
  EXPECT_THAT(plan->device_ids(), ::testing::ElementsAre("n1/cpu:0", "n1/cpu:1", "n1/cpu:2", "n1/cpu:3"));
  EXPECT_THAT(plan->reasons(0), HasSubstr("nodes: 1 x 4 devices (n1)"));
}

TEST(PlannerNodesTest, SpansNodesForMoreDevicesWithTheSameCountOnEach) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 0);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), NodeDevices(2, 2, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->nodes(), ::testing::ElementsAre("n1", "n2"));
  EXPECT_EQ(plan->devices_per_node(), 2);
  // Ranks node by node: 0 and 1 on n1, 2 and 3 on n2.
  EXPECT_THAT(plan->device_ids(), ::testing::ElementsAre("n1/cpu:0", "n1/cpu:1", "n2/cpu:0", "n2/cpu:1"));
  EXPECT_EQ(plan->per_device_batch() * plan->grad_accum_steps() * 4, 256);
}

TEST(PlannerNodesTest, UnevenNodesGetEqualShares) {
  // n1 has 3 free, n2 has 1: 4 devices cannot be split evenly over two nodes, and 3 does not divide
  // 256, so 2 devices on n1 (fewest nodes) beats 1 + 1.
  std::vector<DeviceCapacity> devices = NodeDevices(1, 3, 4096 * kMiB);
  devices.push_back({"n2/cpu:0", 4096 * kMiB, "n2"});
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 0);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), devices);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->device_ids_size(), 2);
  EXPECT_THAT(plan->nodes(), ::testing::ElementsAre("n1"));
}

TEST(PlannerNodesTest, MinAndMaxNodesBoundTheNodeCount) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 4);
  spec.mutable_resources()->set_min_nodes(2);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), NodeDevices(3, 4, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->nodes(), ::testing::ElementsAre("n1", "n2"));
  EXPECT_EQ(plan->devices_per_node(), 2);

  spec.mutable_resources()->set_min_nodes(0);
  spec.mutable_resources()->set_max_devices(0);
  spec.mutable_resources()->set_max_nodes(2);
  plan = PlanJob(spec, Profile(spec), NodeDevices(3, 4, 4096 * kMiB));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->nodes_size(), 2);
  EXPECT_EQ(plan->device_ids_size(), 8);
}

TEST(PlannerNodesTest, TooFewNodesWithFreeDevicesWaits) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 0);
  spec.mutable_resources()->set_min_nodes(3);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), NodeDevices(2, 2, 4096 * kMiB));
  EXPECT_TRUE(absl::IsUnavailable(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("min_nodes"));
}

TEST(PlannerNodesTest, LimitsRefuseMoreNodesNamingWhy) {
  fitrun::v1::JobSpec spec = MlpSpec(256, 1, 0);
  PlanLimits limits;
  limits.max_nodes = 1;
  limits.max_nodes_reason = "start fitrund with --shared_dir for more";
  spec.mutable_resources()->set_min_nodes(2);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), NodeDevices(2, 2, 4096 * kMiB), {}, limits);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("--shared_dir"));

  spec.mutable_resources()->set_min_nodes(0);
  plan = PlanJob(spec, Profile(spec), NodeDevices(2, 2, 4096 * kMiB), {}, limits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->nodes_size(), 1);
  EXPECT_THAT(plan->reasons(0), HasSubstr("--shared_dir"));
}

TEST(PlannerNodesTest, TheTightestNodeSetsTheBatch) {
  // n2's devices are small: two nodes means n2's budget, which is named.
  std::vector<DeviceCapacity> devices = NodeDevices(1, 2, 4096 * kMiB);
  devices.push_back({"n2/cpu:0", 8 * kMiB, "n2"});
  devices.push_back({"n2/cpu:1", 8 * kMiB, "n2"});
  fitrun::v1::JobSpec spec = MlpSpec(256, 4, 4);
  absl::StatusOr<fitrun::v1::Plan> plan = PlanJob(spec, Profile(spec), devices);
  if (plan.ok()) {
    EXPECT_THAT(plan->reasons(1), HasSubstr("n2/cpu:"));
  } else {
    EXPECT_THAT(plan.status().message(), HasSubstr("n2/cpu:"));
  }
}

}  // namespace
}  // namespace fitrun::server
