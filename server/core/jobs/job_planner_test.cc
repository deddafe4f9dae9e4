#include "server/core/jobs/job_planner.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "server/core/specs/test_specs.h"
#include "server/core/testing/fake_device_inventory.h"

namespace fitrun::server {
namespace {

// `count` CPU devices of `bytes` each, as the planner sees them.
std::vector<DeviceCapacity> CpuDevices(const JobPlanner& planner, int count, int64_t bytes) {
  FakeDeviceInventory inventory(count, bytes);
  std::vector<DeviceCapacity> devices;
  for (const fitrun::v1::Device& device : inventory.Snapshot()) devices.push_back(planner.CapacityOf(device, bytes, ""));
  return devices;
}

TEST(JobPlannerTest, TheHostMemoryStillToPromiseBoundsTheDevicesAPlanTakes) {
  JobPlanner::Options options;
  options.max_nodes = 1;
  options.host_memory_bytes = 64LL << 30;
  const JobPlanner planner(options);
  fitrun::v1::JobSpec spec = MlpTestSpec(256, 1, 4);
  spec.mutable_resources()->set_host_memory("2GiB");
  const std::vector<DeviceCapacity> devices = CpuDevices(planner, 4, 1LL << 30);

  absl::StatusOr<fitrun::v1::Plan> idle = planner.PlanForSpec(spec, "", devices, planner.HostRoomWhenIdle());
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_EQ(idle->device_ids_size(), 4);
  EXPECT_EQ(idle->host_memory_bytes(), 4 * (2LL << 30));

  // Room for two ranks' 2 GiB: two devices, and the plan says why not more.
  absl::StatusOr<fitrun::v1::Plan> busy = planner.PlanForSpec(spec, "", devices, 5LL << 30);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->device_ids_size(), 2);
  EXPECT_EQ(busy->host_memory_bytes(), 2 * (2LL << 30));

  // Not even an idle host holds one rank: an error naming the field, not a wait.
  spec.mutable_resources()->set_host_memory("128GiB");
  absl::StatusOr<fitrun::v1::Plan> never = planner.PlanForSpec(spec, "", devices, planner.HostRoomWhenIdle());
  ASSERT_FALSE(never.ok());
  EXPECT_TRUE(absl::StrContains(never.status().message(), "spec.resources.host_memory")) << never.status();
}

TEST(JobPlannerTest, AJobsPlanAfterAnOutOfMemoryTakesASmallerBatch) {
  const JobPlanner planner(JobPlanner::Options{});
  fitrun::v1::Job job;
  *job.mutable_spec() = MlpTestSpec(256, 1, 1);
  const std::vector<DeviceCapacity> devices = CpuDevices(planner, 1, 4LL << 30);
  absl::StatusOr<fitrun::v1::Plan> first = planner.PlanForJob(job, devices, -1);
  ASSERT_TRUE(first.ok()) << first.status();
  fitrun::v1::OutOfMemory* oom = job.add_oom_history();
  oom->set_per_device_batch(first->per_device_batch());
  absl::StatusOr<fitrun::v1::Plan> replanned = planner.PlanForJob(job, devices, -1);
  ASSERT_TRUE(replanned.ok()) << replanned.status();
  EXPECT_LT(replanned->per_device_batch(), first->per_device_batch());
  // The same global batch, through more accumulation.
  EXPECT_EQ(replanned->per_device_batch() * replanned->grad_accum_steps(),
            first->per_device_batch() * first->grad_accum_steps());
}

TEST(JobPlannerTest, AScriptsOwnAllocatorSettingsWinOverFitrunds) {
  JobPlanner::Options options;
  options.cuda_allocator_config = "expandable_segments:True";
  const JobPlanner planner(options);
  fitrun::v1::JobSpec spec;
  EXPECT_EQ(planner.AllocatorConfigFor(spec), "expandable_segments:True");
  (*spec.mutable_script()->mutable_env())["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:128";
  EXPECT_EQ(planner.AllocatorConfigFor(spec), "max_split_size_mb:128");
  EXPECT_EQ(planner.HostRoomWhenIdle(), -1) << "no --host_memory: the host's is not bounded";
}

}  // namespace
}  // namespace fitrun::server
