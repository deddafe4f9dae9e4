#include "server/core/jobs/attempt_launch.h"

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "fitrun/v1/worker.pb.h"
#include "server/testing/read_file.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

// The assignment file an attempt's ranks read, parsed (a test failure when it is not).
fitrun::v1::WorkerAssignment ReadAssignment(const std::string& path) {
  fitrun::v1::WorkerAssignment assignment;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(ReadFileForTest(path), &assignment)) << path;
  return assignment;
}

// Device cpu:0 (its kind only), and a plan of one rank on it.
fitrun::v1::Device Cpu0() {
  fitrun::v1::Device device;
  device.set_id("cpu:0");
  device.set_kind(fitrun::v1::DEVICE_KIND_CPU);
  return device;
}
fitrun::v1::Plan OneRankOnCpu0() {
  fitrun::v1::Plan plan;
  plan.add_device_ids("cpu:0");
  return plan;
}
AttemptLaunchSettings WorkerAt(const std::string& binary) {
  AttemptLaunchSettings settings;
  settings.worker_binary = binary;
  return settings;
}

TEST(AttemptLaunchTest, EveryRankGetsTheContractAndTheAssignmentSaysWhatEachMayUse) {
  TempDir dir;
  const std::string job_dir = dir.Join("j-000007");
  fitrun::v1::Job job;
  job.set_id("j-000007");
  job.mutable_spec()->set_name("two-ranks");
  fitrun::v1::Plan plan;
  plan.add_device_ids("cpu:1");
  plan.add_device_ids("cpu:0");
  plan.set_per_device_batch(32);
  std::vector<fitrun::v1::Device> devices(2);
  for (int i = 0; i < 2; ++i) {
    devices[i].set_id(absl::StrCat("cpu:", i));
    devices[i].set_kind(fitrun::v1::DEVICE_KIND_CPU);
    devices[i].set_total_bytes(static_cast<int64_t>(i + 1) << 30);
    devices[i].set_cpu_threads(i + 1);
  }
  AttemptLaunchSettings settings{"/opt/fitrun-worker", "10.0.0.1:7070", "/etc/ca.pem",
                                 "/srv/fitrun/datasets"};
  job.mutable_spec()->mutable_resources()->set_time_limit_minutes(90);
  plan.add_nodes("n1");
  plan.set_devices_per_node(2);
  absl::StatusOr<AttemptLaunch> attempt = AssembleAttempt(job, "secret", 3, plan, devices, job_dir, settings);
  ASSERT_TRUE(attempt.ok()) << attempt.status();
  EXPECT_EQ(attempt->job_id, "j-000007");
  EXPECT_EQ(attempt->attempt, 3);
  // What a scheduler is asked for: the plan's nodes, and per rank the first device's threads and
  // (a virtual CPU device's memory being host memory) its memory.
  EXPECT_EQ(attempt->nodes, std::vector<std::string>{"n1"});
  EXPECT_EQ(attempt->ranks_per_node, 2);
  EXPECT_EQ(attempt->cpus_per_rank, 2);
  EXPECT_FALSE(attempt->gpu_per_rank);
  EXPECT_EQ(attempt->memory_per_rank_bytes, 2LL << 30);
  EXPECT_EQ(attempt->time_limit_minutes, 90);
  // What the attempt's processes may use together: per rank its CPU device's memory and 2 GiB for
  // the process, 512 tasks.
  EXPECT_EQ(attempt->host_memory_limit_bytes, (2LL << 30) + (2LL << 30) + (1LL << 30) + (2LL << 30));
  EXPECT_EQ(attempt->max_processes, 2 * 512);
  const std::vector<WorkerLaunch>* launches = &attempt->ranks;
  ASSERT_EQ(launches->size(), 2u);
  const std::string assignment_path = job_dir + "/attempt-3/assignment.textproto";
  for (int rank = 0; rank < 2; ++rank) {
    const WorkerLaunch& launch = (*launches)[rank];
    EXPECT_EQ(launch.rank, rank);
    EXPECT_EQ(launch.argv, std::vector<std::string>{"/opt/fitrun-worker"});
    EXPECT_EQ(launch.working_dir, job_dir + "/attempt-3");
    EXPECT_EQ(launch.log_path, absl::StrCat(job_dir, "/attempt-3/rank-", rank, ".log"));
    const std::map<std::string, std::string> env(launch.env.begin(), launch.env.end());
    EXPECT_EQ(env.at("RANK"), absl::StrCat(rank));
    EXPECT_EQ(env.at("WORLD_SIZE"), "2");
    EXPECT_EQ(env.count("MASTER_ADDR"), 0u) << "the rendezvous is the launcher's to choose";
    EXPECT_EQ(env.at("FITRUN_COORDINATOR"), "10.0.0.1:7070");
    EXPECT_EQ(env.at("FITRUN_JOB_ID"), "j-000007");
    EXPECT_EQ(env.at("FITRUN_ATTEMPT"), "3");
    EXPECT_EQ(env.count("FITRUN_JOB_TOKEN"), 0u) << "the launcher hands the token over, not the environment";
    EXPECT_EQ(launch.job_token, "secret");
    EXPECT_EQ(env.at("FITRUN_ASSIGNMENT"), assignment_path);
    EXPECT_EQ(env.at("FITRUN_TLS_CA"), "/etc/ca.pem");
    // plan.device_ids[rank]'s threads: cpu:1 has 2, cpu:0 has 1.
    EXPECT_EQ(env.at("OPENBLAS_NUM_THREADS"), rank == 0 ? "2" : "1");
  }
  const fitrun::v1::WorkerAssignment assignment = ReadAssignment(assignment_path);
  EXPECT_EQ(assignment.job_id(), "j-000007");
  EXPECT_EQ(assignment.attempt(), 3);
  EXPECT_EQ(assignment.plan().per_device_batch(), 32);
  EXPECT_EQ(assignment.checkpoint_dir(), job_dir + "/checkpoints");
  EXPECT_TRUE(std::filesystem::is_directory(job_dir + "/checkpoints"));
  // Rank r's cap and threads are those of plan.device_ids[r].
  ASSERT_EQ(assignment.memory_cap_bytes_size(), 2);
  EXPECT_EQ(assignment.memory_cap_bytes(0), 2LL << 30);
  EXPECT_EQ(assignment.memory_cap_bytes(1), 1LL << 30);
  EXPECT_EQ(assignment.cpu_threads(0), 2);
  EXPECT_EQ(assignment.cpu_threads(1), 1);
  EXPECT_EQ(assignment.dataset_cache_dir(), "/srv/fitrun/datasets");
}

TEST(AttemptLaunchTest, WithoutADatasetCacheDirectoryTheAssignmentNamesNone) {
  TempDir dir;
  fitrun::v1::Job job;
  job.set_id("j-000008");
  ASSERT_TRUE(AssembleAttempt(job, "secret", 1, OneRankOnCpu0(), {Cpu0()}, dir.Join("j-000008"),
                              WorkerAt("/opt/fitrun-worker"))
                  .ok());
  const fitrun::v1::WorkerAssignment assignment = ReadAssignment(dir.Join("j-000008/attempt-1/assignment.textproto"));
  EXPECT_EQ(assignment.job_id(), "j-000008");
  EXPECT_EQ(assignment.dataset_cache_dir(), "");
}

TEST(AttemptLaunchTest, AScriptJobsRanksRunTheSupervisorAndOthersTheWorker) {
  TempDir dir;
  const std::string job_dir = dir.Join("j-000009");
  fitrun::v1::Job job;
  job.set_id("j-000009");
  const fitrun::v1::Plan plan = OneRankOnCpu0();
  AttemptLaunchSettings settings = WorkerAt("/opt/fitrun-worker");
  settings.script_binary = "/opt/fitrun-supervisor";
  EXPECT_EQ(AssembleAttempt(job, "secret", 1, plan, {Cpu0()}, job_dir, settings)->ranks[0].argv[0],
            "/opt/fitrun-worker");
  job.mutable_spec()->mutable_script()->add_command("/usr/bin/python3");
  EXPECT_EQ(AssembleAttempt(job, "secret", 1, plan, {Cpu0()}, job_dir, settings)->ranks[0].argv[0],
            "/opt/fitrun-supervisor");
  settings.script_binary.clear();
  EXPECT_EQ(AssembleAttempt(job, "secret", 1, plan, {Cpu0()}, job_dir, settings)->ranks[0].argv[0],
            "/opt/fitrun-worker")
      << "without a supervisor installed, the worker supervises";
}

TEST(AttemptLaunchTest, TheSpecsHostMemoryAndProcessesBoundTheAttemptPerRank) {
  TempDir dir;
  const std::string job_dir = dir.Join("j-000010");
  fitrun::v1::Job job;
  job.set_id("j-000010");
  fitrun::v1::Plan plan;
  plan.add_device_ids("cuda:0");
  plan.add_device_ids("cuda:1");
  std::vector<fitrun::v1::Device> gpus(2);
  for (int i = 0; i < 2; ++i) {
    gpus[i].set_id(absl::StrCat("cuda:", i));
    gpus[i].set_kind(fitrun::v1::DEVICE_KIND_CUDA);
    gpus[i].set_total_bytes(80LL << 30);
  }
  const AttemptLaunchSettings settings = WorkerAt("/opt/fitrun-worker");
  // On GPUs a rank's host memory is not its device's: 4 GiB each by default.
  absl::StatusOr<AttemptLaunch> attempt = AssembleAttempt(job, "secret", 1, plan, gpus, job_dir, settings);
  ASSERT_TRUE(attempt.ok()) << attempt.status();
  EXPECT_EQ(attempt->host_memory_limit_bytes, 2 * (4LL << 30));
  EXPECT_EQ(attempt->max_processes, 2 * 512);
  EXPECT_EQ(attempt->memory_per_rank_bytes, 0) << "a scheduler is not asked for host memory nobody named";

  job.mutable_spec()->mutable_resources()->set_host_memory("1.5GiB");
  job.mutable_spec()->mutable_resources()->set_max_processes(100);
  attempt = AssembleAttempt(job, "secret", 1, plan, gpus, job_dir, settings);
  ASSERT_TRUE(attempt.ok()) << attempt.status();
  EXPECT_EQ(attempt->host_memory_limit_bytes, 2 * (3LL << 29));
  EXPECT_EQ(attempt->max_processes, 200);
  EXPECT_EQ(attempt->memory_per_rank_bytes, 3LL << 29) << "what the spec names is what a rank asks for";
}

}  // namespace
}  // namespace fitrun::server
