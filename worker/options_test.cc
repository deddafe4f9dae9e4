#include "worker/options.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "proto/contract/testing/temp_dir.h"

namespace fitrun::worker {
namespace {

class OptionsTest : public ::testing::Test {
 protected:
  EnvLookup Lookup() {
    return [this](const std::string& name) -> std::optional<std::string> {
      auto it = env_.find(name);
      if (it == env_.end()) return std::nullopt;
      return it->second;
    };
  }
  std::map<std::string, std::string> env_ = {
      {"RANK", "1"},          {"WORLD_SIZE", "2"},         {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29500"}, {"FITRUN_ASSIGNMENT", "/a"}, {"FITRUN_COORDINATOR", "127.0.0.1:7000"},
      {"FITRUN_JOB_ID", "job-1"}, {"FITRUN_ATTEMPT", "3"},   {"FITRUN_JOB_TOKEN", "t"},
  };

  // Writes `text` to `name` in the test's own directory; its path.
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = dir_.Join(name);
    std::ofstream(path) << text;
    return path;
  }

  contract::TempDir dir_;
};

TEST_F(OptionsTest, ReadsTheContract) {
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromEnvironment(Lookup());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->rank, 1);
  EXPECT_EQ(options->world_size, 2);
  EXPECT_EQ(options->local_rank, 1);  // defaults to RANK
  EXPECT_EQ(options->local_world_size, 2);
  EXPECT_EQ(options->master_addr, "127.0.0.1");
  EXPECT_EQ(options->master_port, 29500);
  EXPECT_EQ(options->assignment_path, "/a");
  EXPECT_EQ(options->coordinator, "127.0.0.1:7000");
  EXPECT_EQ(options->job_id, "job-1");
  EXPECT_EQ(options->attempt, 3);
  EXPECT_EQ(options->job_token, "t");
}

TEST_F(OptionsTest, ATokenByDescriptorIsReadThenTheDescriptorClosedAndTheProcessUndumpable) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(write(fds[1], "from-the-pipe", 13), 13);
  close(fds[1]);
  env_.erase("FITRUN_JOB_TOKEN");
  env_["FITRUN_JOB_TOKEN_FD"] = std::to_string(fds[0]);
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromEnvironment(Lookup());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job_token_fd, fds[0]);
  ASSERT_TRUE(TakeJobToken(*options).ok());
  EXPECT_EQ(options->job_token, "from-the-pipe");
  EXPECT_EQ(fcntl(fds[0], F_GETFD), -1) << "the descriptor is closed";
  EXPECT_EQ(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 0) << "the job's other processes cannot read this one";
  // An empty pipe holds no token: the rank cannot speak for the job.
  ASSERT_EQ(pipe(fds), 0);
  close(fds[1]);
  options->job_token_fd = fds[0];
  options->job_token.clear();
  EXPECT_NE(TakeJobToken(*options).message().find("FITRUN_JOB_TOKEN_FD"), std::string::npos);
}

// A warm rank's identity as fitrund writes it (launch_contract.h's kWarmFd): entries, an empty one, the token.
std::string WarmIdentity(const std::vector<std::string>& entries, const std::string& token) {
  std::string message;
  for (const std::string& entry : entries) message.append(entry).push_back('\0');
  message.push_back('\0');
  return message + token;
}

// Feeds `message` to AwaitWarmIdentity through a pipe named by FITRUN_WARM_FD, keeping this test
// process's stdout, stderr and working directory as they were.
absl::Status AwaitWarm(const std::string& message, int* token_fd) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe");
  if (write(fds[1], message.data(), message.size()) != static_cast<ssize_t>(message.size())) {
    return absl::InternalError("write");
  }
  close(fds[1]);
  setenv("FITRUN_WARM_FD", std::to_string(fds[0]).c_str(), 1);
  const int out = dup(STDOUT_FILENO), err = dup(STDERR_FILENO);
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return absl::InternalError("getcwd");
  const absl::Status status = AwaitWarmIdentity();
  std::fflush(stdout);
  dup2(out, STDOUT_FILENO);
  dup2(err, STDERR_FILENO);
  close(out);
  close(err);
  if (chdir(cwd) != 0) return absl::InternalError("chdir back");
  *token_fd = fds[0];
  return status;
}

TEST_F(OptionsTest, AWarmRankTakesItsIdentityFromItsPipeAndTheTokenAfterIt) {
  ASSERT_TRUE(dir_.ok());
  const std::string log = dir_.Join("warm-rank.log");
  int fd = -1;
  ASSERT_TRUE(AwaitWarm(WarmIdentity({dir_.path(), log, "RANK=1", "FITRUN_JOB_ID=job-7", "MASTER_ADDR=a=b"}, "secret"), &fd).ok());
  EXPECT_EQ(std::getenv("FITRUN_WARM_FD"), nullptr) << "taken off the environment";
  EXPECT_STREQ(std::getenv("RANK"), "1");
  EXPECT_STREQ(std::getenv("FITRUN_JOB_ID"), "job-7");
  EXPECT_STREQ(std::getenv("MASTER_ADDR"), "a=b") << "split at the first '='";
  ASSERT_NE(std::getenv("FITRUN_JOB_TOKEN_FD"), nullptr);
  EXPECT_EQ(std::string(std::getenv("FITRUN_JOB_TOKEN_FD")), std::to_string(fd));
  EXPECT_TRUE(WarmIdentityTakenAt().has_value());
  // The rest of the pipe is the token, as TakeJobToken reads it.
  WorkerOptions options;
  options.job_token_fd = fd;
  ASSERT_TRUE(TakeJobToken(options).ok());
  EXPECT_EQ(options.job_token, "secret");
  EXPECT_TRUE(std::filesystem::exists(log)) << "its log opened as its stdout and stderr";
  unsetenv("FITRUN_JOB_TOKEN_FD");
}

TEST_F(OptionsTest, AWarmRankWhosePipeEndsBeforeAJobIsLetGo) {
  int fd = -1;
  EXPECT_TRUE(absl::IsCancelled(AwaitWarm("", &fd)));
  close(fd);
  EXPECT_EQ(AwaitWarm(std::string("/tmp\0/tmp/x.log", 15), &fd).code(), absl::StatusCode::kDataLoss);
  close(fd);
  const absl::Status bad = AwaitWarm(WarmIdentity({"/tmp", "/dev/null", "NOEQUALS"}, "t"), &fd);
  close(fd);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.message(), "NOEQUALS")) << bad;
}

TEST_F(OptionsTest, ARankStartedForItsJobWaitsForNoIdentity) {
  unsetenv("FITRUN_WARM_FD");
  EXPECT_TRUE(AwaitWarmIdentity().ok());
}

TEST_F(OptionsTest, CoordinatorIsOptional) {
  env_.erase("FITRUN_COORDINATOR");
  env_.erase("FITRUN_ATTEMPT");
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromEnvironment(Lookup());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->coordinator.empty());
  EXPECT_EQ(options->attempt, 0);
}

TEST_F(OptionsTest, SumsGoThroughSharedMemoryUnlessGlooIsAsked) {
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromEnvironment(Lookup());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->shared_memory_all_reduce);
  env_["FITRUN_ALL_REDUCE"] = "gloo";
  options = WorkerOptionsFromEnvironment(Lookup());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->shared_memory_all_reduce);
}

TEST_F(OptionsTest, ErrorsNameTheVariable) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK", "2"},        {"RANK", "x"},        {"WORLD_SIZE", "0"}, {"MASTER_PORT", "70000"},
      {"MASTER_ADDR", ""},  {"LOCAL_RANK", "5"},  {"FITRUN_ATTEMPT", "-1"}, {"FITRUN_ALL_REDUCE", "nccl"},
  };
  for (const auto& [name, value] : cases) {
    auto saved = env_;
    env_[name] = value;
    absl::Status status = WorkerOptionsFromEnvironment(Lookup()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << "=" << value;
    EXPECT_TRUE(absl::StrContains(status.message(), name)) << status;
    env_ = saved;
  }
  env_.erase("FITRUN_ASSIGNMENT");
  EXPECT_TRUE(absl::StrContains(WorkerOptionsFromEnvironment(Lookup()).status().message(),
                                "FITRUN_ASSIGNMENT: not set"));
}

constexpr char kAssignment[] = R"pb(
  job_id: "job-1"
  attempt: 3
  spec {
    model { builtin: "mlp" }
    data { kind: DATA_KIND_FASHION_MNIST path: "/usr/share/datasets/fashion-mnist" }
    optimizer { kind: OPTIMIZER_KIND_SGD lr: 0.1 momentum: 0.9 }
    global_batch_size: 256
    epochs: 1
    seed: 1
  }
  plan {
    device_ids: "cpu:0"
    device_ids: "cpu:1"
    per_device_batch: 128
    grad_accum_steps: 1
    learning_rate: 0.05
    steps_per_epoch: 234
    total_steps: 234
  }
  cpu_threads: 1
  cpu_threads: 1
)pb";

TEST_F(OptionsTest, LoadsAndValidatesAnAssignment) {
  absl::StatusOr<fitrun::v1::WorkerAssignment> assignment =
      LoadAssignment(WriteFile("ok.textproto", kAssignment));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->plan().total_steps(), 234);
  EXPECT_DOUBLE_EQ(assignment->plan().learning_rate(), 0.05);
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromEnvironment(Lookup());
  ASSERT_TRUE(options.ok());
  EXPECT_TRUE(ValidateAssignment(*assignment, *options).ok());
}

TEST_F(OptionsTest, SyntaxErrorsCarryTheLine) {
  absl::Status status = LoadAssignment(WriteFile("bad.textproto", "job_id: \"x\"\nplan { nope: 1 }\n")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "line 2")) << status;
  EXPECT_EQ(LoadAssignment("/nonexistent/assignment").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(OptionsTest, ValidationErrorsNameTheField) {
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromEnvironment(Lookup());
  ASSERT_TRUE(options.ok());
  absl::StatusOr<fitrun::v1::WorkerAssignment> good = LoadAssignment(WriteFile("v.textproto", kAssignment));
  ASSERT_TRUE(good.ok());

  auto expect_field = [&](const std::function<void(fitrun::v1::WorkerAssignment&)>& edit,
                          const std::string& field) {
    fitrun::v1::WorkerAssignment a = *good;
    edit(a);
    absl::Status status = ValidateAssignment(a, *options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_TRUE(absl::StrContains(status.message(), field)) << status;
  };
  expect_field([](auto& a) { a.mutable_plan()->add_device_ids("cpu:2"); }, "plan.device_ids");
  expect_field([](auto& a) { a.mutable_plan()->set_device_ids(1, "tpu:0"); }, "plan.device_ids[1]");
  expect_field([](auto& a) { a.mutable_plan()->set_device_ids(1, "cuda:"); }, "plan.device_ids[1]");
  expect_field([](auto& a) { a.set_job_id("other"); }, "FITRUN_JOB_ID");
  expect_field([](auto& a) { a.mutable_spec()->mutable_data()->clear_path(); }, "spec.data.path");
  expect_field([](auto& a) { a.add_cpu_threads(1); }, "cpu_threads");
  expect_field([](auto& a) { a.add_memory_cap_bytes(1); }, "memory_cap_bytes");
  expect_field([](auto& a) { a.mutable_spec()->mutable_ddp()->set_collective_timeout_seconds(-1); },
               "spec.ddp.collective_timeout_seconds");
  expect_field([](auto& a) { a.mutable_spec()->mutable_ddp()->set_comm_hook(static_cast<fitrun::v1::CommHook>(7)); },
               "spec.ddp.comm_hook");
  expect_field(
      [](auto& a) {
        auto* fault = a.mutable_spec()->mutable_fault_injection();
        fault->set_kind(fitrun::v1::FaultInjection::KIND_EXIT);
        fault->set_rank(5);
        fault->set_at_step(3);
      },
      "spec.fault_injection.rank");
}

TEST(ParsePlanDeviceTest, CpuAndCudaWithTheirIndex) {
  absl::StatusOr<PlanDevice> cpu = ParsePlanDevice("cpu:3", "plan.device_ids[0]");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->kind, PlanDevice::Kind::kCpu);
  EXPECT_EQ(cpu->index, 3);
  absl::StatusOr<PlanDevice> cuda = ParsePlanDevice("cuda:1", "plan.device_ids[0]");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->kind, PlanDevice::Kind::kCuda);
  EXPECT_EQ(cuda->index, 1);
  EXPECT_EQ(ParsePlanDevice("gpu:0", "f")->kind, PlanDevice::Kind::kCuda);
  for (const char* bad : {"cpu", "cpu:-1", "cuda:x", "", "mps:0"}) {
    absl::Status status = ParsePlanDevice(bad, "plan.device_ids[1]").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(status.message(), "plan.device_ids[1]")) << status;
  }
}

TEST(ParsePlanDeviceTest, ASliceOfAGpuIsOnThatGpu) {
  absl::StatusOr<PlanDevice> slice = ParsePlanDevice("cuda:2#1", "plan.device_ids[0]");
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->kind, PlanDevice::Kind::kCuda);
  EXPECT_EQ(slice->index, 2);
  EXPECT_FALSE(ParsePlanDevice("cuda:2#x", "f").ok());
  EXPECT_FALSE(ParsePlanDevice("cpu:0#1", "f").ok());
}

TEST(ResourcesOfTest, EachRanksDeviceCapAndThreadsReadInOnePlace) {
  fitrun::v1::WorkerAssignment assignment;
  assignment.mutable_plan()->add_device_ids("cpu:0");
  assignment.mutable_plan()->add_device_ids("cuda:0#1");
  assignment.add_memory_cap_bytes(1 << 30);
  assignment.add_memory_cap_bytes(2LL << 30);
  assignment.add_cpu_threads(4);
  assignment.add_cpu_threads(0);
  absl::StatusOr<RankResources> rank1 = ResourcesOf(assignment, 1);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(rank1->device_field, "plan.device_ids[1]");
  EXPECT_EQ(rank1->device.kind, PlanDevice::Kind::kCuda);
  EXPECT_EQ(rank1->memory_cap_bytes, 2LL << 30);
  EXPECT_EQ(rank1->cpu_threads, 1) << "0 threads: one";
  EXPECT_EQ(ResourcesOf(assignment, 0)->cpu_threads, 4);
  EXPECT_FALSE(ResourcesOf(assignment, 2).ok());
  // A probe runs on the host with rank 0's cap and threads.
  EXPECT_EQ(ProbeResourcesOf(assignment).memory_cap_bytes, 1 << 30);
  EXPECT_EQ(ProbeResourcesOf(assignment).cpu_threads, 4);
  EXPECT_EQ(ProbeResourcesOf(fitrun::v1::WorkerAssignment()).memory_cap_bytes, 0);
}

TEST(ParsePlanDeviceTest, ANodesGpuIsTheOnlyOneItsRankSees) {
  absl::StatusOr<PlanDevice> cuda = ParsePlanDevice("n2/cuda:3", "plan.device_ids[0]");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->kind, PlanDevice::Kind::kCuda);
  EXPECT_EQ(cuda->index, 0);
  absl::StatusOr<PlanDevice> cpu = ParsePlanDevice("n2/cpu:1", "plan.device_ids[0]");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->kind, PlanDevice::Kind::kCpu);
  EXPECT_EQ(cpu->index, 1);
  EXPECT_FALSE(ParsePlanDevice("n2/", "f").ok());
}

}  // namespace
}  // namespace fitrun::worker
