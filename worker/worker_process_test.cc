// Runs real fitrun-worker processes (two ranks) against an in-process fake coordinator on a tiny
// generated dataset: the launch contract, the reports on the wire and the exit codes. Multi-process
// tests with the real coordinator live in tests/.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"
#include "proto/contract/free_port.h"
#include "worker/report/fake_coordinator.h"

extern char** environ;

namespace fitrun::worker {
namespace {

using fitrun::v1::WorkerReport;

constexpr int kWorld = 2;
constexpr int kTrainSamples = 1024;
constexpr int kTestSamples = 200;

std::string WorkerBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/worker/fitrun-worker");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class WorkerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    data_dir_ = testing::MakeTempDir("fake_fashion_mnist");
    testing::WriteFakeFashionMnist(data_dir_, kTrainSamples, kTestSamples);

    fitrun::v1::JobSpec* spec = assignment_.mutable_spec();
    assignment_.set_job_id("job-1");
    assignment_.set_attempt(1);
    spec->mutable_model()->set_builtin("mlp");
    spec->mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
    spec->mutable_data()->set_path(data_dir_);
    spec->mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
    spec->mutable_optimizer()->set_momentum(0.9);
    spec->set_seed(4);
    spec->mutable_ddp()->set_collective_timeout_seconds(20);
    fitrun::v1::Plan* plan = assignment_.mutable_plan();
    plan->add_device_ids("cpu:0");
    plan->add_device_ids("cpu:1");
    plan->set_per_device_batch(32);
    plan->set_grad_accum_steps(2);
    plan->set_learning_rate(0.05);
    plan->set_steps_per_epoch(kTrainSamples / (32 * 2 * kWorld));
    plan->set_total_steps(12);
    assignment_.add_cpu_threads(1);
    assignment_.add_cpu_threads(1);
  }

  void TearDown() override {
    for (pid_t pid : running_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  // Starts every rank with the launch contract; the coordinator is optional.
  // Serves `coordinator` on a port of its own and starts the ranks reporting to it; the caller shuts
  // the server down before the coordinator goes.
  std::unique_ptr<grpc::Server> ServeAndStartRanks(FakeCoordinator& coordinator) {
    int port = 0;
    std::unique_ptr<grpc::Server> server = coordinator.Serve(&port);
    EXPECT_NE(port, 0);
    StartRanks(port);
    return server;
  }

  void StartRanks(int coordinator_port) {
    const std::string assignment_path = dir_ + "/assignment.textproto";
    std::string text;
    ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(assignment_, &text));
    std::ofstream(assignment_path) << text;
    const int master_port = fitrun::contract::PickFreeLoopbackPort().value();
    const int world = world_;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<std::string> env = {
          absl::StrCat("RANK=", rank),
          absl::StrCat("LOCAL_RANK=", rank),
          absl::StrCat("WORLD_SIZE=", world),
          absl::StrCat("LOCAL_WORLD_SIZE=", world),
          "MASTER_ADDR=127.0.0.1",
          absl::StrCat("MASTER_PORT=", master_port),
          "FITRUN_ASSIGNMENT=" + assignment_path,
          "FITRUN_JOB_ID=job-1",
          "FITRUN_ATTEMPT=1",
          "FITRUN_JOB_TOKEN=token-1",
      };
      if (coordinator_port != 0) env.push_back(absl::StrCat("FITRUN_COORDINATOR=127.0.0.1:", coordinator_port));
      std::vector<char*> envp;
      for (std::string& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);

      const std::string log = absl::StrCat(dir_, "/rank", rank, ".log");
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
      posix_spawn_file_actions_addchdir_np(&actions, dir_.c_str());
      std::string binary = WorkerBinary();
      char* argv[] = {binary.data(), nullptr};
      pid_t pid = 0;
      ASSERT_EQ(posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv, envp.data()), 0) << binary;
      posix_spawn_file_actions_destroy(&actions);
      pids_.push_back(pid);
      running_.insert(pid);
    }
  }

  // The exit status of rank `rank`; -signal when it was killed, -1000 on timeout (then killed).
  int WaitRank(int rank, absl::Duration timeout = absl::Seconds(60)) {
    const pid_t pid = pids_[rank];
    const absl::Time deadline = absl::Now() + timeout;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        running_.erase(pid);
        ADD_FAILURE() << "rank " << rank << " timed out; log:\n" << Log(rank);
        return -1000;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    running_.erase(pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

  // Runs `fitrun-worker --probe <flags>` on assignment_ with `input` on its stdin and returns its
  // exit status; stdout goes to *out, stderr to the test's log.
  int RunProbe(const std::vector<std::string>& flags, std::string* out, const std::string& input = "") {
    const std::string assignment_path = dir_ + "/probe_assignment.textproto";
    std::string text;
    google::protobuf::TextFormat::PrintToString(assignment_, &text);
    std::ofstream(assignment_path) << text;
    const std::string stdin_path = dir_ + "/probe.in";
    std::ofstream(stdin_path) << input;
    std::string env_assignment = "FITRUN_ASSIGNMENT=" + assignment_path;
    char* envp[] = {env_assignment.data(), nullptr};
    const std::string stdout_path = dir_ + "/probe.out";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, stdin_path.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    std::string binary = WorkerBinary();
    std::string probe = "--probe";
    std::vector<std::string> args = flags;
    std::vector<char*> argv = {binary.data(), probe.data()};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), envp) != 0) return -1;
    posix_spawn_file_actions_destroy(&actions);
    int status = 0;
    waitpid(pid, &status, 0);
    *out = ReadFile(stdout_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

  std::string Log(int rank) { return ReadFile(absl::StrCat(dir_, "/rank", rank, ".log")); }
  // How many of the coordinator's reports were RankFailed; each one's reason must hold `reason_has`.
  static int FailedReports(FakeCoordinator& coordinator, const std::string& reason_has = "") {
    int failed = 0;
    for (const WorkerReport& r : coordinator.reports()) {
      if (!r.has_failed()) continue;
      ++failed;
      EXPECT_TRUE(absl::StrContains(r.failed().reason(), reason_has)) << r.failed().reason();
    }
    return failed;
  }

  // Each rank's reports in order, grouped by the rank its Hello named.
  static std::map<int, std::vector<WorkerReport>> ByRank(const std::vector<WorkerReport>& reports) {
    std::map<int, std::vector<WorkerReport>> by_rank;
    // Reports of one stream arrive in order, and every stream starts with a Hello; streams of the
    // two ranks interleave, so rank is taken from the report itself where it has one.
    for (const WorkerReport& r : reports) {
      int rank = -1;
      if (r.has_hello()) rank = r.hello().rank();
      if (r.has_progress()) rank = r.progress().rank();
      if (r.has_log()) rank = r.log().rank();
      if (r.has_finished()) rank = r.finished().rank();
      if (r.has_oom()) rank = r.oom().rank();
      by_rank[rank].push_back(r);
    }
    return by_rank;
  }

  int world_ = kWorld;  // ranks StartRanks starts
  std::string dir_;
  std::string data_dir_;
  fitrun::v1::WorkerAssignment assignment_;
  std::vector<pid_t> pids_;
  std::set<pid_t> running_;
};

TEST_F(WorkerProcessTest, TwoRanksReportAndFinishWithEqualChecksums) {
  FakeCoordinator coordinator;
  auto server = ServeAndStartRanks(coordinator);
  EXPECT_EQ(WaitRank(0), 0) << Log(0);
  EXPECT_EQ(WaitRank(1), 0) << Log(1);

  auto by_rank = ByRank(coordinator.reports());
  std::vector<std::string> checksums;
  for (int rank = 0; rank < kWorld; ++rank) {
    const std::vector<WorkerReport>& reports = by_rank[rank];
    ASSERT_GE(reports.size(), 4u) << "rank " << rank;
    ASSERT_TRUE(reports.front().has_hello());
    EXPECT_EQ(reports.front().hello().job_id(), "job-1");
    EXPECT_EQ(reports.front().hello().attempt(), 1);
    EXPECT_EQ(reports.front().hello().world_size(), kWorld);
    EXPECT_EQ(reports.front().hello().job_token(), "token-1");
    EXPECT_EQ(reports.front().hello().pid(), pids_[rank]);
    int64_t first_step = 0, last_step = 0;
    for (const WorkerReport& r : reports) {
      if (!r.has_progress()) continue;
      if (first_step == 0) first_step = r.progress().step();
      last_step = r.progress().step();
      EXPECT_EQ(r.progress().total_steps(), 12);
    }
    EXPECT_EQ(first_step, 1);
    EXPECT_EQ(last_step, 12);
    ASSERT_TRUE(reports.back().has_finished()) << reports.back().DebugString();
    const fitrun::v1::RankFinished& finished = reports.back().finished();
    EXPECT_EQ(finished.steps(), 12);
    EXPECT_EQ(finished.parameter_checksum().size(), 16u);
    EXPECT_GT(finished.train_seconds(), 0);
    EXPECT_EQ(finished.has_test_accuracy(), rank == 0);
    if (rank == 0) {
      EXPECT_GT(finished.test_accuracy(), 0.5);
    }
    checksums.push_back(finished.parameter_checksum());
  }
  EXPECT_EQ(checksums[0], checksums[1]);
  // Both ranks half-closed their streams before exiting 0.
  EXPECT_EQ(coordinator.streams_closed_by_worker(), kWorld);
  server->Shutdown();
}

TEST_F(WorkerProcessTest, StandaloneRanksLogTheirResult) {
  StartRanks(/*coordinator_port=*/0);
  EXPECT_EQ(WaitRank(0), 0) << Log(0);
  EXPECT_EQ(WaitRank(1), 0) << Log(1);
  EXPECT_TRUE(absl::StrContains(Log(0), "test accuracy")) << Log(0);
  EXPECT_TRUE(absl::StrContains(Log(1), "finished 12 steps")) << Log(1);
}

// "parameter checksum 1093c6d3ec54526c" of a standalone rank's final line.
std::string ParameterChecksum(const std::string& log) {
  const std::string key = "parameter checksum ";
  const size_t at = log.find(key);
  return at == std::string::npos ? "" : log.substr(at + key.size(), 16);
}

TEST_F(WorkerProcessTest, ADatasetCacheIsWrittenOnceThenMappedAndTrainsTheSame) {
  // Without a cache, with a cold one (written), with a warm one (mapped): the same training.
  std::vector<std::string> checksums;
  const std::string cache_dir = dir_ + "/datasets";
  for (const std::string& dataset_cache_dir : {std::string(), cache_dir, cache_dir}) {
    assignment_.set_dataset_cache_dir(dataset_cache_dir);
    pids_.clear();
    StartRanks(/*coordinator_port=*/0);
    ASSERT_EQ(WaitRank(0), 0) << Log(0);
    ASSERT_EQ(WaitRank(1), 0) << Log(1);
    EXPECT_FALSE(absl::StrContains(Log(0), "dataset cache")) << Log(0);
    checksums.push_back(ParameterChecksum(Log(0)));
    if (dataset_cache_dir.empty()) {
      EXPECT_FALSE(std::filesystem::exists(cache_dir));
      continue;
    }
    // The training split's images and labels, and the test split's that rank 0 evaluates on.
    int entries = 0;
    for (const auto& file : std::filesystem::directory_iterator(cache_dir)) {
      EXPECT_TRUE(absl::EndsWith(file.path().string(), ".idxcache")) << file.path();
      ++entries;
    }
    EXPECT_EQ(entries, 4);
  }
  ASSERT_EQ(checksums[0].size(), 16u) << Log(0);
  EXPECT_EQ(checksums[1], checksums[0]);
  EXPECT_EQ(checksums[2], checksums[0]);
}

TEST_F(WorkerProcessTest, ADatasetCacheThatCannotBeCreatedCostsOneLogLine) {
  std::ofstream(dir_ + "/not-a-directory") << "a file";
  assignment_.set_dataset_cache_dir(dir_ + "/not-a-directory/datasets");
  StartRanks(/*coordinator_port=*/0);
  EXPECT_EQ(WaitRank(0), 0) << Log(0);
  EXPECT_EQ(WaitRank(1), 0) << Log(1);
  for (int rank = 0; rank < kWorld; ++rank) {
    const std::string log = Log(rank);
    const size_t first = log.find("dataset cache " + dir_ + "/not-a-directory/datasets not written");
    EXPECT_NE(first, std::string::npos) << log;
    EXPECT_EQ(log.find("dataset cache", first + 1), std::string::npos) << "one line only:\n" << log;
    EXPECT_TRUE(absl::StrContains(log, "training samples loaded")) << log;
  }
}

TEST_F(WorkerProcessTest, FaultInjectionExitsWithItsCodeAndThePeerFails) {
  fitrun::v1::FaultInjection* fault = assignment_.mutable_spec()->mutable_fault_injection();
  fault->set_kind(fitrun::v1::FaultInjection::KIND_EXIT);
  fault->set_rank(1);
  fault->set_at_step(3);
  fault->set_exit_code(7);
  FakeCoordinator coordinator;
  auto server = ServeAndStartRanks(coordinator);
  EXPECT_EQ(WaitRank(1), 7) << Log(1);
  // Rank 0 sees its peer vanish in the next all-reduce (or times out in it).
  EXPECT_EQ(WaitRank(0), 1) << Log(0);

  auto by_rank = ByRank(coordinator.reports());
  bool logged = false;
  for (const WorkerReport& r : by_rank[1]) {
    if (r.has_progress()) {
      EXPECT_LT(r.progress().step(), 3);
    }
    logged |= r.has_log() && absl::StrContains(r.log().text(), "before step 3");
  }
  EXPECT_TRUE(logged) << "the fault's log line should be flushed before the exit";
  bool failed = false;
  for (const WorkerReport& r : coordinator.reports()) failed |= r.has_failed();
  EXPECT_TRUE(failed) << "rank 0 reports RankFailed before exiting";
  server->Shutdown();
}

TEST_F(WorkerProcessTest, StopCommandEndsEveryRankWith143) {
  assignment_.mutable_plan()->set_total_steps(1000000);
  FakeCoordinator coordinator;
  coordinator.stop_after_progress = true;
  auto server = ServeAndStartRanks(coordinator);
  EXPECT_EQ(WaitRank(0, absl::Seconds(30)), 143) << Log(0);
  EXPECT_EQ(WaitRank(1, absl::Seconds(30)), 143) << Log(1);
  EXPECT_EQ(FailedReports(coordinator, "stopped by the coordinator"), kWorld);
  server->Shutdown();
}

TEST_F(WorkerProcessTest, BadAssignmentExitsTwoAndSaysWhy) {
  assignment_.mutable_plan()->add_device_ids("cpu:2");  // three devices for two ranks
  FakeCoordinator coordinator;
  auto server = ServeAndStartRanks(coordinator);
  EXPECT_EQ(WaitRank(0), 2) << Log(0);
  EXPECT_EQ(WaitRank(1), 2) << Log(1);
  EXPECT_TRUE(absl::StrContains(Log(0), "plan.device_ids")) << Log(0);
  EXPECT_EQ(FailedReports(coordinator, "plan.device_ids"), kWorld);
  server->Shutdown();
}

// A CUDA device the worker cannot use is a configuration error (exit 2) naming the field, not a
// crash: a CPU build says it was built without CUDA; a CUDA build has no 100th GPU either.
TEST_F(WorkerProcessTest, UnusableCudaDeviceExitsTwoAndSaysWhy) {
  assignment_.mutable_plan()->set_device_ids(0, "cuda:98");
  assignment_.mutable_plan()->set_device_ids(1, "cuda:99");
  FakeCoordinator coordinator;
  auto server = ServeAndStartRanks(coordinator);
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(WaitRank(rank), 2) << Log(rank);
    const std::string field = absl::StrCat("plan.device_ids[", rank, "]");
    EXPECT_TRUE(absl::StrContains(Log(rank), field)) << Log(rank);
    EXPECT_TRUE(absl::StrContains(Log(rank), "fitrun-worker was built without CUDA;") ||
                absl::StrContains(Log(rank), "CUDA devices (check CUDA_VISIBLE_DEVICES)"))
        << Log(rank);
  }
  EXPECT_EQ(FailedReports(coordinator, "plan.device_ids["), kWorld);
  server->Shutdown();
}

TEST_F(WorkerProcessTest, TinyMemoryCapSendsOutOfMemoryAndExitsThree) {
  // The MLP's weights (2.7 MB), the broadcast's copy of them and DDP's buckets fit; gradients and
  // momentum on top of them do not.
  constexpr int64_t kCap = 8 << 20;
  assignment_.add_memory_cap_bytes(kCap);
  assignment_.add_memory_cap_bytes(kCap);
  FakeCoordinator coordinator;
  auto server = ServeAndStartRanks(coordinator);
  // Both ranks run out in their first steps, in backward or the optimizer, without waiting on a peer.
  EXPECT_EQ(WaitRank(0), 3) << Log(0);
  EXPECT_EQ(WaitRank(1), 3) << Log(1);

  auto by_rank = ByRank(coordinator.reports());
  for (int rank = 0; rank < kWorld; ++rank) {
    const std::vector<WorkerReport>& reports = by_rank[rank];
    auto oom = std::find_if(reports.begin(), reports.end(), [](const WorkerReport& r) { return r.has_oom(); });
    ASSERT_NE(oom, reports.end()) << "rank " << rank << " sent no OutOfMemory; log:\n" << Log(rank);
    const fitrun::v1::OutOfMemory& o = oom->oom();
    EXPECT_EQ(o.rank(), rank);
    EXPECT_GE(o.step(), 1);
    EXPECT_LE(o.step(), 2);
    EXPECT_EQ(o.per_device_batch(), 32);
    EXPECT_EQ(o.cap_bytes(), kCap);
    EXPECT_GT(o.requested_bytes(), 0);
    EXPECT_GT(o.live_bytes(), 2 << 20) << "the weights alone are live";
    EXPECT_LE(o.live_bytes(), kCap);
    EXPECT_GT(o.live_bytes() + o.requested_bytes(), kCap) << "the refused request would have passed the cap";
    EXPECT_GE(o.peak_bytes(), o.live_bytes());
    EXPECT_LE(o.peak_bytes(), kCap);
  }
  EXPECT_EQ(FailedReports(coordinator), kWorld) << "RankFailed still follows the OutOfMemory";
  server->Shutdown();
}

// The numbers in fitrun-worker --probe's output: its header line, then one line per batch.
struct ProbeOutput {
  int64_t model_state_bytes = -1;
  int64_t train_samples = -1;
  std::vector<std::pair<int64_t, int64_t>> peaks;  // (batch, peak_bytes)
  std::vector<int64_t> out_of_memory;              // batches refused for the budget
  int lines = 0;
};

ProbeOutput ParseProbeOutput(const std::string& text) {
  ProbeOutput out;
  std::smatch m;
  auto number = [&](const std::string& key) -> int64_t {
    return std::regex_search(text, m, std::regex("\"" + key + "\": (-?[0-9]+)")) ? std::stoll(m[1]) : -1;
  };
  out.model_state_bytes = number("model_state_bytes");
  out.train_samples = number("train_samples");
  const std::regex peak("\\{\"batch\": ([0-9]+), \"peak_bytes\": ([0-9]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), peak); it != std::sregex_iterator(); ++it) {
    out.peaks.emplace_back(std::stoll((*it)[1]), std::stoll((*it)[2]));
  }
  const std::regex refused("\\{\"batch\": ([0-9]+), \"error\": [^\\n]*\"out_of_memory\": true");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), refused); it != std::sregex_iterator(); ++it) {
    out.out_of_memory.push_back(std::stoll((*it)[1]));
  }
  out.lines = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  return out;
}

TEST_F(WorkerProcessTest, ProbeMeasuresEachBatchAndACappedRunPeaksWhereItSaid) {
  assignment_.mutable_plan()->clear_device_ids();
  assignment_.mutable_plan()->add_device_ids("cpu:0");
  assignment_.clear_cpu_threads();
  assignment_.add_cpu_threads(1);
  world_ = 1;
  std::string out;
  ASSERT_EQ(RunProbe({"--probe_batches=4,16,64"}, &out), 0) << out;
  const ProbeOutput probe = ParseProbeOutput(out);
  EXPECT_EQ(probe.lines, 4) << "a header and one line per batch: " << out;
  // The MLP's float32 weights: 784*512 + 512 + 512*512 + 512 + 512*10 + 10 parameters.
  EXPECT_EQ(probe.model_state_bytes, 669706 * 4) << out;
  EXPECT_EQ(probe.train_samples, kTrainSamples) << out;
  ASSERT_EQ(probe.peaks.size(), 3u) << out;
  EXPECT_EQ(probe.peaks[0].first, 4);
  EXPECT_EQ(probe.peaks[2].first, 64);
  // Weights, gradients and momentum are there at any batch; more samples take more.
  EXPECT_GT(probe.peaks[0].second, 3 * probe.model_state_bytes) << out;
  EXPECT_LT(probe.peaks[0].second, probe.peaks[1].second);
  EXPECT_LT(probe.peaks[1].second, probe.peaks[2].second);

  // A real capped run at the last batch peaks where the probe measured it (the real reducer's
  // buckets and the process group add about 1%).
  constexpr int64_t kBatch = 64;
  assignment_.add_memory_cap_bytes(int64_t{1} << 30);
  assignment_.mutable_plan()->set_per_device_batch(kBatch);
  assignment_.mutable_plan()->set_grad_accum_steps(1);
  assignment_.mutable_plan()->set_steps_per_epoch(0);
  assignment_.mutable_plan()->set_total_steps(4);
  FakeCoordinator coordinator;
  auto server = ServeAndStartRanks(coordinator);
  ASSERT_EQ(WaitRank(0), 0) << Log(0);
  int64_t measured = 0;
  for (const WorkerReport& r : coordinator.reports()) {
    if (r.has_progress()) measured = std::max(measured, r.progress().peak_bytes());
  }
  const double probed = static_cast<double>(probe.peaks[2].second);
  std::printf("probe at batch %lld: %.0f bytes; the capped run measured %lld (%+.2f%%)\n",
              static_cast<long long>(kBatch), probed, static_cast<long long>(measured),
              100.0 * (measured - probed) / probed);
  EXPECT_NEAR(static_cast<double>(measured), probed, 0.03 * probed) << out;
  server->Shutdown();
}

TEST_F(WorkerProcessTest, ProbeMeasuresWhatStdinAsksForATinyGpt) {
  const std::string text_path = dir_ + "/sentences.txt";
  {
    const std::string sentences = "the quick brown fox jumps over the lazy dog. a stitch in time saves nine. ";
    std::string text;
    while (text.size() < 20000) text += sentences;
    std::ofstream(text_path, std::ios::binary) << text;
  }
  fitrun::v1::JobSpec* spec = assignment_.mutable_spec();
  spec->mutable_model()->set_builtin("gpt");
  fitrun::v1::GptConfig* gpt = spec->mutable_model()->mutable_gpt();
  gpt->set_layers(1);
  gpt->set_heads(2);
  gpt->set_hidden(32);
  gpt->set_context(16);
  spec->mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_ADAMW);
  spec->mutable_data()->set_kind(fitrun::v1::DATA_KIND_TEXT);
  spec->mutable_data()->set_path(text_path);
  std::string out;
  ASSERT_EQ(RunProbe({}, &out, "2\n\n8\n"), 0) << out;
  const ProbeOutput probe = ParseProbeOutput(out);
  ASSERT_EQ(probe.peaks.size(), 2u) << out;
  EXPECT_EQ(probe.peaks[0].first, 2);
  EXPECT_EQ(probe.peaks[1].first, 8);
  EXPECT_GT(probe.model_state_bytes, 0) << out;
  EXPECT_GT(probe.peaks[0].second, probe.model_state_bytes) << out;
  EXPECT_GT(probe.peaks[1].second, probe.peaks[0].second) << out;
}

TEST_F(WorkerProcessTest, ProbeRefusesABatchPastItsBudgetAndGoesOn) {
  assignment_.clear_memory_cap_bytes();
  assignment_.add_memory_cap_bytes(12 << 20);  // the mlp's states fit; 1024 samples do not
  std::string out;
  ASSERT_EQ(RunProbe({}, &out, "1024\n4\n"), 0) << out;
  const ProbeOutput probe = ParseProbeOutput(out);
  EXPECT_EQ(probe.out_of_memory, std::vector<int64_t>{1024}) << out;
  ASSERT_EQ(probe.peaks.size(), 1u) << out;
  EXPECT_EQ(probe.peaks[0].first, 4);
}

TEST_F(WorkerProcessTest, ProbeErrorsNameTheFieldAndExitTwo) {
  std::string out;
  EXPECT_EQ(RunProbe({"--probe_batches=8,0"}, &out), 2);
  EXPECT_EQ(out, "");
  EXPECT_EQ(RunProbe({}, &out, "eight\n"), 2);
  EXPECT_EQ(ParseProbeOutput(out).lines, 1) << "only the header: " << out;
  EXPECT_EQ(RunProbe({"--probe_batches=4096"}, &out), 2);
  EXPECT_TRUE(absl::StrContains(out, "must be in 1..1024")) << out;
  assignment_.mutable_spec()->mutable_data()->set_path(dir_ + "/missing");
  EXPECT_EQ(RunProbe({"--probe_batches=4"}, &out), 2);
  EXPECT_EQ(out, "");
}

}  // namespace
}  // namespace fitrun::worker
