#include "worker/script/script_process.h"

#include <signal.h>

#include <fstream>

#include <stdlib.h>

#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "worker/testing/script_env.h"

namespace fitrun::worker {
namespace {

using ::testing::ElementsAre;

fitrun::v1::JobSpec ScriptSpec() {
  fitrun::v1::JobSpec spec;
  auto* script = spec.mutable_script();
  script->add_command("sh");
  script->add_command("train.sh");
  script->set_working_dir("/tmp");
  script->set_batch_flag("--batch_size");
  script->set_grad_accum_flag("--accum");
  (*script->mutable_env())["OMP_NUM_THREADS"] = "1";
  (*script->mutable_env())["PYTHONPATH"] = "/mine";
  return spec;
}

ScriptRunSettings Settings() {
  ScriptRunSettings s;
  s.rank = 1;
  s.world_size = 2;
  s.per_device_batch = 48;
  s.grad_accum_steps = 3;
  s.learning_rate = 0.002;
  s.global_batch_size = 288;
  s.checkpoint_dir = "/state/jobs/j-1/checkpoints";
  s.max_steps = 100;
  s.memory_cap_bytes = 1 << 30;
  return s;
}

TEST(ScriptCommandForTest, TheSpecsArgvWithThePlansFlagsFoundOnPath) {
  absl::StatusOr<ScriptCommand> command =
      ScriptCommandFor(ScriptSpec(), Settings(), {"/lib/libfitrun_memory.so", "/fitrun/python"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_THAT(command->argv, ElementsAre("sh", "train.sh", "--accum", "3", "--batch_size", "48"));
  EXPECT_EQ(command->executable.substr(command->executable.size() - 3), "/sh");
  EXPECT_EQ(command->working_dir, "/tmp");
}

TEST(ScriptCommandForTest, FitrunsVariablesComeLastAndTheSupervisorsSecretsNotAtAll) {
  setenv("FITRUN_JOB_TOKEN", "secret", 1);
  setenv("FITRUN_COORDINATOR", "127.0.0.1:1", 1);
  setenv("LD_PRELOAD", "/other.so", 1);
  absl::StatusOr<ScriptCommand> command =
      ScriptCommandFor(ScriptSpec(), Settings(), {"/lib/libfitrun_memory.so", "/fitrun/python"});
  unsetenv("FITRUN_JOB_TOKEN");
  unsetenv("FITRUN_COORDINATOR");
  unsetenv("LD_PRELOAD");
  ASSERT_TRUE(command.ok()) << command.status();
  std::map<std::string, std::string> env = testing::EnvOf(*command);
  EXPECT_EQ(env.count("FITRUN_JOB_TOKEN"), 0u);
  EXPECT_EQ(env.count("FITRUN_COORDINATOR"), 0u);
  EXPECT_EQ(env["RANK"], "1");
  EXPECT_EQ(env["WORLD_SIZE"], "2");
  EXPECT_EQ(env["FITRUN_PER_DEVICE_BATCH"], "48");
  EXPECT_EQ(env["FITRUN_GRAD_ACCUM_STEPS"], "3");
  EXPECT_EQ(env["FITRUN_LR"], "0.002");
  EXPECT_EQ(env["FITRUN_GLOBAL_BATCH_SIZE"], "288");
  EXPECT_EQ(env["FITRUN_CHECKPOINT_DIR"], "/state/jobs/j-1/checkpoints");
  EXPECT_EQ(env["FITRUN_MAX_STEPS"], "100");
  EXPECT_EQ(env.count("FITRUN_PROBE"), 0u);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  // The allocator goes first so that its symbols win; the user's own preloads and module path stay.
  EXPECT_EQ(env["LD_PRELOAD"], "/lib/libfitrun_memory.so:/other.so");
  EXPECT_EQ(env["FITRUN_MEMORY_CAP_BYTES"], "1073741824");
  EXPECT_EQ(env["PYTHONPATH"], "/fitrun/python:/mine");
  EXPECT_EQ(env["PYTHONUNBUFFERED"], "1");
}

TEST(ScriptCommandForTest, EveryRankIsToldThePlansStrategyButOnlyAScriptThatAppliesItIsToldToChangeHowItTrains) {
  ScriptRunSettings sharded = Settings();
  sharded.zero_stage = 1;
  fitrun::v1::JobSpec plain = ScriptSpec();
  plain.mutable_script()->set_activation_checkpointing(true);  // not the script's to take: it does not apply it
  absl::StatusOr<ScriptCommand> command = ScriptCommandFor(plain, sharded, {});
  ASSERT_TRUE(command.ok()) << command.status();
  std::map<std::string, std::string> env = testing::EnvOf(*command);
  EXPECT_EQ(env["FITRUN_ACTIVATION_CHECKPOINTING"], "0");
  EXPECT_EQ(env["FITRUN_ZERO_STAGE"], "0");
  EXPECT_EQ(env["FITRUN_PRECISION"], "fp32");

  fitrun::v1::JobSpec applies = plain;
  applies.mutable_script()->set_applies_strategy(true);
  applies.set_precision(fitrun::v1::PRECISION_BF16);
  command = ScriptCommandFor(applies, sharded, {});
  ASSERT_TRUE(command.ok()) << command.status();
  env = testing::EnvOf(*command);
  EXPECT_EQ(env["FITRUN_ACTIVATION_CHECKPOINTING"], "1");
  EXPECT_EQ(env["FITRUN_ZERO_STAGE"], "1");
  EXPECT_EQ(env["FITRUN_PRECISION"], "bf16");

  applies.mutable_script()->set_activation_checkpointing(false);
  command = ScriptCommandFor(applies, Settings(), {});
  ASSERT_TRUE(command.ok()) << command.status();
  env = testing::EnvOf(*command);
  EXPECT_EQ(env["FITRUN_ACTIVATION_CHECKPOINTING"], "0");
  EXPECT_EQ(env["FITRUN_ZERO_STAGE"], "0");
}

TEST(ScriptCommandForTest, AProbeRunIsToldSoAndGetsNoFlagsForAnUnplannedBatch) {
  ScriptRunSettings probe = Settings();
  probe.probe = true;
  probe.per_device_batch = 0;
  probe.grad_accum_steps = 0;
  absl::StatusOr<ScriptCommand> command = ScriptCommandFor(ScriptSpec(), probe, {});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_THAT(command->argv, ElementsAre("sh", "train.sh"));
  std::map<std::string, std::string> env = testing::EnvOf(*command);
  EXPECT_EQ(env["FITRUN_PROBE"], "1");
  EXPECT_EQ(env["FITRUN_GRAD_ACCUM_STEPS"], "1");
  EXPECT_EQ(env.count("FITRUN_MEMORY_CAP_BYTES"), 0u);  // no allocator to read it
}

TEST(ScriptCommandForTest, ACommandThatCannotBeFoundNamesTheField) {
  fitrun::v1::JobSpec spec = ScriptSpec();
  spec.mutable_script()->set_command(0, "no-such-program-anywhere");
  EXPECT_THAT(ScriptCommandFor(spec, Settings(), {}).status().message(),
              ::testing::HasSubstr("spec.script.command[0]: 'no-such-program-anywhere' is not on PATH"));
  spec.mutable_script()->clear_command();
  EXPECT_THAT(ScriptCommandFor(spec, Settings(), {}).status().message(),
              ::testing::HasSubstr("spec.script.command: empty"));
}

TEST(LooksLikeOutOfMemoryTest, PyTorchsAndPythonsOutOfMemoryErrors) {
  EXPECT_TRUE(LooksLikeOutOfMemory("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"));
  EXPECT_TRUE(LooksLikeOutOfMemory("RuntimeError: CUDA out of memory."));
  EXPECT_TRUE(LooksLikeOutOfMemory("RuntimeError: [enforce fail at alloc_cpu.cpp:75] . DefaultCPUAllocator: can't allocate memory"));
  EXPECT_TRUE(LooksLikeOutOfMemory("  MemoryError"));
  EXPECT_FALSE(LooksLikeOutOfMemory("loss 0.5, memory 12 MiB"));
  EXPECT_FALSE(LooksLikeOutOfMemory("ValueError: bad batch"));
}

// On a GPU nothing is preloaded (the machine's PyTorch is not the LibTorch the allocator was built
// for); a slice's cap still reaches the script, for the fitrun module to apply.
TEST(ScriptCommandForTest, OnAGpuNothingIsPreloadedAndTheSlicesCapIsPassedOn) {
  ScriptRunSettings gpu = Settings();
  gpu.preload_allocator = false;
  absl::StatusOr<ScriptCommand> command =
      ScriptCommandFor(ScriptSpec(), gpu, {"/opt/fitrun/libfitrun_memory.so", "/opt/fitrun/python"});
  ASSERT_TRUE(command.ok()) << command.status();
  std::map<std::string, std::string> env = testing::EnvOf(*command);
  EXPECT_EQ(env["LD_PRELOAD"].find("libfitrun_memory.so"), std::string::npos) << env["LD_PRELOAD"];
  EXPECT_EQ(env["FITRUN_MEMORY_CAP_BYTES"], absl::StrCat(1 << 30));
  EXPECT_EQ(env["PYTHONPATH"].substr(0, 18), "/opt/fitrun/python");
}

// The size that failed, as the script saw it, from either allocator's message.
TEST(RequestedBytesInOutOfMemoryTest, TheSizeEitherAllocatorNames) {
  EXPECT_EQ(RequestedBytesInOutOfMemory("torch.cuda.OutOfMemoryError: CPU device memory cap exceeded: tried to "
                                        "allocate 268435456 bytes with 51972 bytes live and a cap of 201326592 bytes"),
            268435456);
  EXPECT_EQ(RequestedBytesInOutOfMemory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. "
                                        "GPU 0 has a total capacity of 79.19 GiB"),
            256LL << 20);
  EXPECT_EQ(RequestedBytesInOutOfMemory("MemoryError"), 0);
}

// The script's memory meter: a descriptor it inherits (no name in the file system another account
// could take first), which it writes while it runs and which still reads after it exited; a meter
// named in the spec's environment is not the one it gets.
TEST(ScriptProcessTest, TheScriptWritesItsMemoryMeterThroughAnInheritedDescriptor) {
  ScriptCommand command;
  command.executable = "/usr/bin/python3";
  command.argv = {"python3", "-c", R"(
import os, struct, sys, time
fd = int(os.environ["FITRUN_MEMORY_METER_FD"])
os.pwrite(fd, struct.pack("<5q", 4096, 1024, 0, 0, 2), 0)
print("written", flush=True)
sys.stdin.readline()
)"};
  command.env = {"FITRUN_MEMORY_METER_FD=0", "PATH=/usr/bin:/bin"};
  absl::Notification written;
  ScriptProcess::Callbacks callbacks;
  callbacks.on_stdout_line = [&](const std::string& line) {
    if (line == "written") written.Notify();
  };
  absl::StatusOr<std::unique_ptr<ScriptProcess>> process = ScriptProcess::Start(command, callbacks);
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE(written.WaitForNotificationWithTimeout(absl::Seconds(30))) << (*process)->StderrTail();
  // While it runs: the supervisor's heartbeats read it now.
  fitrun::contract::meter::MemoryReading running = (*process)->Memory();
  EXPECT_EQ(running.peak_bytes, 4096);
  EXPECT_EQ(running.live_bytes, 1024);
  EXPECT_EQ(running.writer, fitrun::contract::meter::kWriterCudaModule);
  (*process)->Signal(SIGTERM);
  (*process)->Wait();
  EXPECT_EQ((*process)->Memory().peak_bytes, 4096) << "after the exit";
}

}  // namespace
}  // namespace fitrun::worker
