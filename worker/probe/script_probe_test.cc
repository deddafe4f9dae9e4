#include "worker/probe/script_probe.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "proto/contract/launch_contract.h"
#include "worker/testing/script_env.h"

namespace fitrun::worker {
namespace {

using ::testing::HasSubstr;
namespace launch = fitrun::contract::launch;

fitrun::v1::WorkerAssignment ScriptAssignment(const std::string& device_id, const std::string& script) {
  fitrun::v1::WorkerAssignment assignment;
  assignment.set_job_id("memory-probe");
  fitrun::v1::ScriptSpec* spec = assignment.mutable_spec()->mutable_script();
  spec->add_command("/usr/bin/python3");
  spec->add_command(script);
  spec->set_batch_flag("--batch_size");
  if (!device_id.empty()) assignment.mutable_plan()->add_device_ids(device_id);
  assignment.add_memory_cap_bytes(int64_t{4} << 30);
  assignment.add_cpu_threads(1);
  return assignment;
}

TEST(ScriptProbeDeviceTest, ThePlansFirstDeviceOrTheHost) {
  EXPECT_EQ(ScriptProbeDevice(ScriptAssignment("", "train.py"))->kind, PlanDevice::Kind::kCpu);
  absl::StatusOr<PlanDevice> gpu = ScriptProbeDevice(ScriptAssignment("cuda:1#0", "train.py"));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->kind, PlanDevice::Kind::kCuda);
  EXPECT_EQ(gpu->index, 1);
  EXPECT_THAT(ScriptProbeDevice(ScriptAssignment("tpu:0", "train.py")).status().message(),
              HasSubstr("plan.device_ids[0]"));
}

// On the host the preloaded allocator counts the script's tensors (into the memory meter the script
// process gets, script_process_test).
TEST(ScriptProbeRunSettingsTest, OnTheHostThePreloadedAllocatorCounts) {
  const fitrun::v1::WorkerAssignment assignment = ScriptAssignment("", "train.py");
  ScriptRunSettings settings = ScriptProbeRunSettings(assignment, PlanDevice{}, 64);
  absl::StatusOr<ScriptCommand> command =
      ScriptCommandFor(assignment.spec(), settings, {"/opt/fitrun/libfitrun_memory.so", "/opt/fitrun/python"});
  ASSERT_TRUE(command.ok()) << command.status();
  std::map<std::string, std::string> env = testing::EnvOf(*command);
  EXPECT_EQ(env["LD_PRELOAD"].substr(0, 31), "/opt/fitrun/libfitrun_memory.so");
  EXPECT_EQ(env[launch::kDeviceKind], launch::kDeviceKindCpu);
  EXPECT_EQ(env[launch::kProbe], "1");
  EXPECT_EQ(env[launch::kMaxSteps], absl::StrCat(ScriptProbe::kSteps));
}

// On a GPU the script's tensors are CUDA tensors the preloaded allocator never sees: nothing is
// preloaded, the script sees the probe's GPU alone, and the fitrun module writes torch.cuda's
// allocated peak into the memory meter instead.
TEST(ScriptProbeRunSettingsTest, OnAGpuTheFitrunModuleCountsTorchCudasAllocations) {
  const fitrun::v1::WorkerAssignment assignment = ScriptAssignment("cuda:3", "train.py");
  ScriptRunSettings settings = ScriptProbeRunSettings(assignment, *ScriptProbeDevice(assignment), 64);
  EXPECT_FALSE(settings.preload_allocator);
  absl::StatusOr<ScriptCommand> command =
      ScriptCommandFor(assignment.spec(), settings, {"/opt/fitrun/libfitrun_memory.so", "/opt/fitrun/python"});
  ASSERT_TRUE(command.ok()) << command.status();
  std::map<std::string, std::string> env = testing::EnvOf(*command);
  EXPECT_EQ(env["LD_PRELOAD"].find("libfitrun_memory.so"), std::string::npos) << env["LD_PRELOAD"];
  EXPECT_EQ(env[launch::kDeviceKind], launch::kDeviceKindCuda);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(env[launch::kMemoryCapBytes], absl::StrCat(int64_t{4} << 30));
  EXPECT_EQ(env["PYTHONPATH"].substr(0, 18), "/opt/fitrun/python");
}

// A whole probe run on a "GPU" whose torch.cuda is a fake the script installs: the measurement is
// the peak torch.cuda reported through the fitrun module, not anything a CPU allocator counted.
TEST(ScriptProbeTest, OnAGpuTheMeasurementIsTorchCudasAllocatedPeak) {
  const std::string script = ::testing::TempDir() + "/fake_cuda_train.py";
  std::ofstream(script) << R"(import sys, types
cuda = types.SimpleNamespace(
    is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
    max_memory_allocated=lambda device=None: 123456789, memory_allocated=lambda device=None: 1000,
    memory_stats=lambda device=None: {}, mem_get_info=lambda device=None: (0, 0),
    get_device_properties=lambda device: types.SimpleNamespace(total_memory=80 << 30),
    set_per_process_memory_fraction=lambda fraction, device: None)
sys.modules["torch"] = types.SimpleNamespace(cuda=cuda)
import fitrun
run = fitrun.init()
assert run.per_device_batch == int(sys.argv[-1]), sys.argv
run.report(1, loss=0.5)
)";
  const std::string python_path =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/client/python");
  absl::StatusOr<std::unique_ptr<ScriptProbe>> probe =
      ScriptProbe::Create(ScriptAssignment("cuda:0", script), SupportFiles{"", python_path});
  ASSERT_TRUE(probe.ok()) << probe.status();
  absl::StatusOr<ProbePeak> peak = (*probe)->Measure(16);
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_EQ(peak->batch, 16);
  EXPECT_EQ(peak->peak_bytes, 123456789);
}

}  // namespace
}  // namespace fitrun::worker
