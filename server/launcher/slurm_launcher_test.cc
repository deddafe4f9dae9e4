// SlurmLauncher against a scripted Slurm: what it asks sbatch for, the batch script it writes, how it
// turns squeue's and scontrol's answers and the shim's exit files into allocation and rank reports,
// and which scancel it sends when. The real cluster is tests/slurm/fitrund_slurm_test.py's.
#include "server/launcher/slurm_launcher.h"

#include <sys/stat.h>
#include <unistd.h>

#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace fitrun::server {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// Slurm as scripted by the test: sbatch hands out job 42, squeue and scontrol say what `state` says,
// and every command is recorded.
class ScriptedSlurm {
 public:
  slurm::SlurmRunner Runner() {
    return [this](const std::vector<std::string>& argv) -> absl::StatusOr<std::string> {
      absl::MutexLock lock(&mu_);
      commands_.push_back(absl::StrJoin(argv, " "));
      const std::string& program = argv[0];
      if (program == "sbatch") return std::string("42\n");
      if (program == "squeue" && absl::StrContains(commands_.back(), "--format=%i|%k")) return listing_;
      if (program == "squeue") {
        if (!squeue_error_.empty()) return absl::UnavailableError(squeue_error_);
        if (state_.empty()) return std::string("");
        return absl::StrCat("42|", state_, "|", reason_, "|n[1-2]\n");
      }
      if (program == "scontrol") {
        if (state_.empty()) return absl::UnavailableError("slurm_load_jobs error: Invalid job id specified");
        return absl::StrCat("JobId=42 JobName=", name_, " UserId=someone(", user_id_, ") GroupId=someone(",
                            user_id_, ") JobState=", state_, " Reason=", reason_, " ExitCode=0:0 WorkDir=", work_dir_,
                            " NodeList=n[1-2]", comment_.empty() ? "" : " Comment=", comment_, "\n");
      }
      if (program == "scancel") return std::string("");
      return absl::NotFoundError(program);
    };
  }
  void Set(const std::string& state, const std::string& reason = "None") {
    absl::MutexLock lock(&mu_);
    state_ = state;
    reason_ = reason;
  }
  // Whose job 42 is (scontrol show job's UserId, JobName and Comment).
  void SetOwner(int64_t user_id, const std::string& name, const std::string& comment) {
    absl::MutexLock lock(&mu_);
    user_id_ = user_id;
    name_ = name;
    comment_ = comment;
  }
  void SetSqueueError(const std::string& error) {
    absl::MutexLock lock(&mu_);
    squeue_error_ = error;
  }
  void SetListing(const std::string& listing) {
    absl::MutexLock lock(&mu_);
    listing_ = listing;
  }
  void SetWorkDir(const std::string& dir) {
    absl::MutexLock lock(&mu_);
    work_dir_ = dir;
  }
  std::vector<std::string> Commands() {
    absl::MutexLock lock(&mu_);
    return commands_;
  }
  int Count(const std::string& command) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count(commands_.begin(), commands_.end(), command));
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> commands_;
  std::string state_ = "PENDING";
  std::string reason_ = "None";
  std::string squeue_error_;
  std::string listing_;
  std::string work_dir_;
  int64_t user_id_ = getuid();
  std::string name_ = "fitrun-j1";
  std::string comment_ = "fitrund-tag";
};

// Reports from the launcher, for the test to wait on.
class Reports {
 public:
  AllocationCallback OnAllocation() {
    return [this](const AllocationStatus& status) {
      absl::MutexLock lock(&mu_);
      allocations_.push_back(absl::StrCat(status.granted ? "granted " : "waiting ", status.text));
    };
  }
  WorkerLauncher::RankExitCallback OnExit() {
    return [this](int rank, const WorkerExit& exit) {
      absl::MutexLock lock(&mu_);
      exits_.push_back(absl::StrCat("rank ", rank, " code ", exit.exit_code, " signal ", exit.signal));
    };
  }
  // Waits until `what` holds of the reports so far (10 s at most); returns whether it did.
  bool WaitFor(const std::function<bool(const std::vector<std::string>&, const std::vector<std::string>&)>& what) {
    absl::MutexLock lock(&mu_);
    auto holds = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return what(allocations_, exits_); };
    return mu_.AwaitWithTimeout(absl::Condition(&holds), absl::Seconds(10));
  }
  std::vector<std::string> Exits() {
    absl::MutexLock lock(&mu_);
    return exits_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> allocations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> exits_ ABSL_GUARDED_BY(mu_);
};

// Polls `condition` (state the launcher changes through the scripted Slurm) for 10 s at most.
bool Eventually(const std::function<bool()>& condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

bool Has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

class SlurmLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    attempt_dir_ = std::filesystem::path(::testing::TempDir()) /
                   ::testing::UnitTest::GetInstance()->current_test_info()->name() / "attempt-1";
    std::filesystem::remove_all(attempt_dir_);
    std::filesystem::create_directories(attempt_dir_);
    slurm_.SetWorkDir(attempt_dir_.string());
  }

  SlurmLauncher::Options Options() {
    SlurmLauncher::Options options;
    options.coordinator_tag = "fitrund-tag";
    options.min_poll_interval = absl::Milliseconds(10);
    options.max_poll_interval = absl::Milliseconds(20);
    options.runner = slurm_.Runner();
    return options;
  }

  // Two nodes x two ranks of job j1, attempt 1.
  AttemptLaunch Attempt() {
    AttemptLaunch attempt;
    attempt.job_id = "j1";
    attempt.attempt = 1;
    attempt.job_dir = attempt_dir_.parent_path().string();
    attempt.attempt_dir_name = "attempt-1";
    for (int rank = 0; rank < 4; ++rank) {
      WorkerLaunch launch;
      launch.job_id = "j1";
      launch.attempt = 1;
      launch.rank = rank;
      launch.argv = {"/opt/fitrun/fitrun-worker"};
      launch.working_dir = attempt_dir_.string();
      launch.log_path = (attempt_dir_ / absl::StrCat("rank-", rank, ".log")).string();
      launch.env = {{"RANK", absl::StrCat(rank)},       {"LOCAL_RANK", absl::StrCat(rank)},
                    {"WORLD_SIZE", "4"},                 {"LOCAL_WORLD_SIZE", "4"},
                    {"FITRUN_JOB_ID", "j1"},             {"FITRUN_COORDINATOR", "10.0.0.1:7070"}};
      launch.job_token = "it's secret";
      attempt.ranks.push_back(launch);
    }
    attempt.nodes = {"n1", "n2"};
    attempt.ranks_per_node = 2;
    attempt.cpus_per_rank = 1;
    attempt.memory_per_rank_bytes = int64_t{1} << 30;
    attempt.on_allocation = reports_.OnAllocation();
    return attempt;
  }

  void WriteExitFile(int rank, int code) {
    std::ofstream(attempt_dir_ / absl::StrCat("rank-", rank, ".exit")) << code << "\n";
  }

  std::filesystem::path attempt_dir_;
  ScriptedSlurm slurm_;
  Reports reports_;
};

TEST_F(SlurmLauncherTest, SbatchAsksForThePlansNodesRanksAndLimits) {
  SlurmLauncher::Options options = Options();
  options.partition = "gpu";
  options.account = "ml";
  options.extra_sbatch_args = {"--qos=high"};
  SlurmLauncher launcher(options);
  AttemptLaunch attempt = Attempt();
  attempt.time_limit_minutes = 90;
  // The script sbatch reads is root's copy, elsewhere; the job's output and directory are the attempt's.
  const std::vector<std::string> argv = launcher.SbatchArgv(attempt, "/tmp/fitrun-sbatch-a1b2c3");
  EXPECT_EQ(argv.front(), "sbatch");
  EXPECT_EQ(argv.back(), "/tmp/fitrun-sbatch-a1b2c3");
  for (const std::string& expected :
       {std::string("--parsable"), std::string("--job-name=fitrun-j1"), std::string("--comment=fitrund-tag"),
        std::string("--nodes=2"), std::string("--ntasks-per-node=2"), std::string("--nodelist=n1,n2"),
        std::string("--cpus-per-task=1"), std::string("--mem=2048M"), std::string("--time=90"),
        std::string("--no-requeue"), std::string("--signal=B:USR2@60"),
        absl::StrCat("--output=", attempt_dir_.string(), "/slurm-batch.log"),
        absl::StrCat("--chdir=", attempt_dir_.string()), std::string("--partition=gpu"), std::string("--account=ml"),
        std::string("--qos=high")}) {
    EXPECT_THAT(argv, Contains(expected));
  }
  EXPECT_THAT(argv, Not(Contains("--gpus-per-task=1")));
  attempt.gpu_per_rank = true;
  EXPECT_THAT(launcher.SbatchArgv(attempt, "/s.sh"), Contains("--gpus-per-task=1"));
}

TEST_F(SlurmLauncherTest, AJobThatRunsAsItsOwnerIsSubmittedWithTheOwnersIds) {
  SlurmLauncher launcher(Options());
  AttemptLaunch attempt = Attempt();
  const std::vector<std::string> as_fitrund = launcher.SbatchArgv(attempt, "/s.sh");
  for (const std::string& arg : as_fitrund) {
    EXPECT_FALSE(absl::StartsWith(arg, "--uid=") || absl::StartsWith(arg, "--gid=")) << arg;
  }
  UnixAccount owner;
  owner.name = "alice";
  owner.uid = 1234;
  owner.gid = 5678;
  owner.home = "/home/alice";
  for (WorkerLaunch& rank : attempt.ranks) rank.run_as = owner;
  const std::vector<std::string> as_owner = launcher.SbatchArgv(attempt, "/s.sh");
  EXPECT_THAT(as_owner, Contains("--uid=1234"));
  EXPECT_THAT(as_owner, Contains("--gid=5678"));
  // The script says who the account is, over fitrund's environment.
  EXPECT_EQ(as_owner.back(), "/s.sh");
  absl::StatusOr<std::string> script = SlurmLauncher::BatchScript(attempt, "/shim.sh");
  ASSERT_TRUE(script.ok()) << script.status();
  for (const char* line : {"export HOME=", "export USER=", "export LOGNAME="}) {
    EXPECT_TRUE(absl::StrContains(*script, line)) << line << " in\n" << *script;
  }
  EXPECT_TRUE(absl::StrContains(*script, "/home/alice")) << *script;
}

TEST_F(SlurmLauncherTest, BatchScriptSharesTheEnvironmentAndLeavesTheRanksToTheShim) {
  absl::StatusOr<std::string> script = SlurmLauncher::BatchScript(Attempt(), "/shared/rank_shim.sh");
  ASSERT_TRUE(script.ok()) << script.status();
  EXPECT_THAT(*script, HasSubstr("export FITRUN_JOB_TOKEN='it'\\''s secret'\n"));
  EXPECT_THAT(*script, HasSubstr("export FITRUN_COORDINATOR='10.0.0.1:7070'\n"));
  EXPECT_THAT(*script, HasSubstr(absl::StrCat("export FITRUN_EXIT_DIR='", attempt_dir_.string(), "'\n")));
  // The shim sets each rank's own; the script sets none of them.
  EXPECT_THAT(*script, Not(HasSubstr("export RANK=")));
  EXPECT_THAT(*script, Not(HasSubstr("export WORLD_SIZE=")));
  EXPECT_THAT(*script, HasSubstr("NodeAddr="));
  EXPECT_THAT(*script, HasSubstr("export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))"));
  EXPECT_THAT(*script, HasSubstr("srun --kill-on-bad-exit=1 --output='" + attempt_dir_.string() +
                                 "/rank-%t.log' '/shared/rank_shim.sh' '/opt/fitrun/fitrun-worker' &"));

  AttemptLaunch uneven = Attempt();
  uneven.ranks[3].env.emplace_back("EXTRA", "1");
  absl::StatusOr<std::string> refused = SlurmLauncher::BatchScript(uneven, "/shared/rank_shim.sh");
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("rank 3"));
}

TEST_F(SlurmLauncherTest, LaunchWritesTheScriptAndTheShimAndReturnsTheSlurmJob) {
  SlurmLauncher launcher(Options());
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(Attempt(), reports_.OnExit());
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_EQ(launched->handle, "slurm:42");
  EXPECT_EQ(launched->pids, std::vector<int>(4, 0));
  const std::filesystem::path script = attempt_dir_ / "slurm-batch.sh";
  const std::filesystem::path shim = attempt_dir_ / "rank_shim.sh";
  ASSERT_TRUE(std::filesystem::exists(script));
  ASSERT_TRUE(std::filesystem::exists(shim));
  // The script holds the job's token: its owner's alone.
  EXPECT_EQ(std::filesystem::status(script).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  std::ifstream shim_in(shim);
  std::string first_line;
  std::getline(shim_in, first_line);
  EXPECT_EQ(first_line, "#!/bin/sh");
  EXPECT_THAT(slurm_.Commands().front(), HasSubstr("sbatch --parsable"));
}

TEST_F(SlurmLauncherTest, WhatTheRanksPlantedInTheAttemptsDirectoryIsNeitherFollowedNorRead) {
  // A victim outside the job's directory, and the ranks' traps inside it: the script's name a
  // symlink to the victim, an exit file a symlink to a file saying 0, another a FIFO.
  const std::filesystem::path victim = attempt_dir_.parent_path().parent_path() / "victim";
  std::ofstream(victim) << "0\n";
  std::filesystem::create_symlink(victim, attempt_dir_ / "slurm-batch.sh");
  SlurmLauncher launcher(Options());
  ASSERT_TRUE(launcher.Launch(Attempt(), reports_.OnExit()).ok());
  EXPECT_FALSE(std::filesystem::is_symlink(attempt_dir_ / "slurm-batch.sh")) << "the link was replaced";
  std::ifstream victim_in(victim);
  std::string victim_text((std::istreambuf_iterator<char>(victim_in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(victim_text, "0\n") << "the victim was not written through the link";
  slurm_.Set("RUNNING");
  std::filesystem::create_symlink(victim, attempt_dir_ / "rank-0.exit");
  ASSERT_EQ(mkfifo((attempt_dir_ / "rank-1.exit").c_str(), 0644), 0);
  WriteExitFile(2, 0);
  EXPECT_TRUE(reports_.WaitFor([](const auto&, const auto& exits) { return exits.size() == 1; }));
  // Polls go on (the FIFO never blocked them); the allocation's end reports the other three as killed.
  slurm_.Set("CANCELLED");
  EXPECT_TRUE(reports_.WaitFor([](const auto&, const auto& exits) { return exits.size() == 4; }));
  EXPECT_THAT(reports_.Exits(), Contains("rank 0 code -1 signal 9"));
  EXPECT_THAT(reports_.Exits(), Contains("rank 1 code -1 signal 9"));
  EXPECT_THAT(reports_.Exits(), Contains("rank 2 code 0 signal 0"));
}

TEST_F(SlurmLauncherTest, ReportsTheWaitThenTheAllocationThenEachRanksOwnExit) {
  slurm_.Set("PENDING", "Resources");
  SlurmLauncher launcher(Options());
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(Attempt(), reports_.OnExit());
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_TRUE(reports_.WaitFor([](const auto& allocations, const auto&) {
    return Has(allocations, "waiting PENDING (Resources)");
  }));
  slurm_.Set("RUNNING");
  EXPECT_TRUE(reports_.WaitFor([](const auto& allocations, const auto&) { return Has(allocations, "granted RUNNING"); }));
  WriteExitFile(0, 0);
  WriteExitFile(1, 3);
  EXPECT_TRUE(reports_.WaitFor([](const auto&, const auto& exits) { return exits.size() == 2; }));
  EXPECT_THAT(reports_.Exits(), Contains("rank 0 code 0 signal 0"));
  EXPECT_THAT(reports_.Exits(), Contains("rank 1 code 3 signal 0"));
  // The allocation ends with ranks 2 and 3 never having written theirs: they were killed.
  slurm_.Set("CANCELLED");
  EXPECT_TRUE(reports_.WaitFor([](const auto&, const auto& exits) { return exits.size() == 4; }));
  EXPECT_THAT(reports_.Exits(), Contains("rank 2 code -1 signal 9"));
  EXPECT_THAT(reports_.Exits(), Contains("rank 3 code -1 signal 9"));
}

TEST_F(SlurmLauncherTest, AJobSlurmForgotIsOverAndItsRanksReported) {
  slurm_.Set("RUNNING");
  SlurmLauncher launcher(Options());
  ASSERT_TRUE(launcher.Launch(Attempt(), reports_.OnExit()).ok());
  for (int rank = 0; rank < 4; ++rank) WriteExitFile(rank, 0);
  slurm_.Set("");  // purged: squeue lists nothing, scontrol says invalid job id
  EXPECT_TRUE(reports_.WaitFor([](const auto&, const auto& exits) { return exits.size() == 4; }));
  EXPECT_THAT(reports_.Exits(), Contains("rank 3 code 0 signal 0"));
}

TEST_F(SlurmLauncherTest, AnUnreadableOrFailingSqueueIsRetriedNotFatal) {
  slurm_.SetSqueueError("Socket timed out on send/recv operation");
  SlurmLauncher launcher(Options());
  ASSERT_TRUE(launcher.Launch(Attempt(), reports_.OnExit()).ok());
  // Several polls fail; nothing is reported from them.
  EXPECT_TRUE(Eventually([this] { return slurm_.Commands().size() >= 4; }));
  EXPECT_TRUE(reports_.Exits().empty());
  slurm_.SetSqueueError("");
  slurm_.Set("RUNNING");
  EXPECT_TRUE(reports_.WaitFor([](const auto& allocations, const auto&) { return Has(allocations, "granted RUNNING"); }));
}

TEST_F(SlurmLauncherTest, StopSignalsTheAllocationOnceAndCancelsItAfterTheGrace) {
  slurm_.Set("RUNNING");
  SlurmLauncher launcher(Options());
  ASSERT_TRUE(launcher.Launch(Attempt(), reports_.OnExit()).ok());
  for (int rank = 0; rank < 4; ++rank) launcher.Stop("slurm:42", rank, absl::Milliseconds(200));
  EXPECT_TRUE(Eventually([this] { return slurm_.Count("scancel 42") == 1; }));
  EXPECT_EQ(slurm_.Count("scancel --signal=TERM --full 42"), 1);
  // Still running after the grace, so cancelled; the TERM came first.
  const std::vector<std::string> commands = slurm_.Commands();
  const auto term = std::find(commands.begin(), commands.end(), "scancel --signal=TERM --full 42");
  const auto cancel = std::find(commands.begin(), commands.end(), "scancel 42");
  EXPECT_LT(term - commands.begin(), cancel - commands.begin());
}

TEST_F(SlurmLauncherTest, StoppingAWaitingAllocationCancelsItAtOnce) {
  slurm_.Set("PENDING", "Priority");
  SlurmLauncher launcher(Options());
  ASSERT_TRUE(launcher.Launch(Attempt(), reports_.OnExit()).ok());
  launcher.Stop("slurm:42", 0, absl::Seconds(60));
  EXPECT_TRUE(Eventually([this] { return slurm_.Count("scancel 42") == 1; }));
  EXPECT_EQ(slurm_.Count("scancel --signal=TERM --full 42"), 0);
}

TEST_F(SlurmLauncherTest, AdoptsAJobSlurmStillRunsAndNotOneThatEnded) {
  slurm_.Set("RUNNING");
  SlurmLauncher launcher(Options());
  RecordedAttempt recorded{"j1", 1, "slurm:42", {0, 0, 0, 0}, {true, true, false, true}, reports_.OnAllocation(),
                           attempt_dir_.parent_path().string(), "attempt-1"};
  EXPECT_EQ(launcher.Adopt(recorded, reports_.OnExit()), (std::vector<bool>{true, true, false, true}));
  // Its exit files are found in the attempt's directory on record.
  for (int rank : {0, 1, 3}) WriteExitFile(rank, 0);
  EXPECT_TRUE(reports_.WaitFor([](const auto&, const auto& exits) { return exits.size() == 3; }));

  slurm_.Set("COMPLETED");
  SlurmLauncher again(Options());
  EXPECT_EQ(again.Adopt(recorded, reports_.OnExit()), std::vector<bool>(4, false));
  EXPECT_EQ(again.Adopt({"j1", 1, "pids:1,2", {1, 2}, {true, true}, {}}, reports_.OnExit()),
            std::vector<bool>(2, false));
}

TEST_F(SlurmLauncherTest, AJobIdNamingAnotherUsersOrCoordinatorsJobIsNeitherAdoptedNorCancelled) {
  // The id on record now names another job (Slurm's ids restart with a fresh controller state): one
  // of another account, one another coordinator submitted, one named for another job.
  RecordedAttempt recorded{"j1", 1, "slurm:42", {0, 0, 0, 0}, {true, true, true, true}, reports_.OnAllocation(),
                           attempt_dir_.parent_path().string(), "attempt-1"};
  slurm_.Set("RUNNING");
  for (const auto& [user_id, name, comment] :
       std::vector<std::tuple<int64_t, std::string, std::string>>{{getuid() + 1000, "fitrun-j1", "fitrund-tag"},
                                                                  {getuid(), "fitrun-j1", "fitrund-other"},
                                                                  {getuid(), "fitrun-j2", "fitrund-tag"},
                                                                  {getuid(), "fitrun-j1", ""}}) {
    slurm_.SetOwner(user_id, name, comment);
    SlurmLauncher launcher(Options());
    EXPECT_EQ(launcher.Adopt(recorded, reports_.OnExit()), std::vector<bool>(4, false)) << name << " " << comment;
    for (int rank = 0; rank < 4; ++rank) launcher.Stop("slurm:42", rank, absl::ZeroDuration());
    absl::SleepFor(absl::Milliseconds(100));  // a few of the poller's rounds
  }
  EXPECT_EQ(slurm_.Count("scancel 42") + slurm_.Count("scancel --signal=TERM --full 42"), 0)
      << "a job that is not this job's was cancelled";
  // Its own is.
  slurm_.SetOwner(getuid(), "fitrun-j1", "fitrund-tag");
  SlurmLauncher launcher(Options());
  EXPECT_EQ(launcher.Adopt(recorded, reports_.OnExit()), std::vector<bool>(4, true));
}

TEST_F(SlurmLauncherTest, ReleasesOnlyThisCoordinatorsUnownedAllocations) {
  slurm_.SetListing("7|fitrund-tag\n8|fitrund-tag\n9|fitrund-other\n10|(null)\n");
  SlurmLauncher launcher(Options());
  launcher.ReleaseUnowned({"slurm:7", "pids:3"});
  // Every user's jobs are listed: those that ran as their owners were submitted under their ids.
  EXPECT_EQ(slurm_.Count("squeue --noheader --all --format=%i|%k"), 1);
  EXPECT_EQ(slurm_.Count("scancel 8"), 1);
  for (const char* spared : {"scancel 7", "scancel 9", "scancel 10"}) EXPECT_EQ(slurm_.Count(spared), 0) << spared;
}

TEST_F(SlurmLauncherTest, SbatchReadsAPrivateCopyOfTheScriptNotTheOwnersFile) {
  // sbatch runs as root and opens the file it is named: the owner's copy in the attempt's directory
  // could be swapped for a link to a root-only file by then. What sbatch is named is root's own.
  SlurmLauncher::Options options = Options();
  slurm::SlurmRunner scripted = options.runner;
  std::string named, text_then;
  struct stat info {};
  options.runner = [&](const std::vector<std::string>& argv) -> absl::StatusOr<std::string> {
    if (argv[0] == "sbatch") {
      named = argv.back();
      EXPECT_EQ(lstat(named.c_str(), &info), 0);
      std::ifstream in(named);
      text_then.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return scripted(argv);
  };
  SlurmLauncher launcher(options);
  ASSERT_TRUE(launcher.Launch(Attempt(), reports_.OnExit()).ok());
  EXPECT_FALSE(absl::StartsWith(named, attempt_dir_.parent_path().string())) << named;
  EXPECT_TRUE(S_ISREG(info.st_mode));
  EXPECT_EQ(info.st_uid, geteuid());
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  absl::StatusOr<std::string> expected = SlurmLauncher::BatchScript(Attempt(), (attempt_dir_ / "rank_shim.sh").string());
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(text_then, *expected);
  EXPECT_FALSE(std::filesystem::exists(named)) << "the private copy outlived the submit";
}

TEST_F(SlurmLauncherTest, AnSbatchCutOffByItsTimeoutLeavesNoAllocationBehind) {
  // sbatch timed out, but slurmctld had queued job 8 (this coordinator's tag) by then; 7 is running
  // and tracked.
  SlurmLauncher::Options options = Options();
  slurm::SlurmRunner scripted = options.runner;
  int sbatches = 0;
  options.runner = [&sbatches, scripted](const std::vector<std::string>& argv) -> absl::StatusOr<std::string> {
    if (argv[0] == "sbatch" && ++sbatches == 2) return absl::DeadlineExceededError("sbatch: timed out");
    absl::StatusOr<std::string> out = scripted(argv);
    if (argv[0] == "sbatch" && out.ok()) return std::string("7\n");
    return out;
  };
  slurm_.Set("RUNNING");
  slurm_.SetListing("7|fitrund-tag\n8|fitrund-tag\n");
  SlurmLauncher launcher(options);
  ASSERT_TRUE(launcher.Launch(Attempt(), reports_.OnExit()).ok());
  absl::StatusOr<LaunchedAttempt> failed = launcher.Launch(Attempt(), reports_.OnExit());
  EXPECT_TRUE(absl::IsDeadlineExceeded(failed.status())) << failed.status();
  EXPECT_TRUE(Eventually([this] { return slurm_.Count("scancel 8") == 1; }));
  EXPECT_EQ(slurm_.Count("scancel 7"), 0);
}

TEST(SlurmLauncherNamesTest, HandlesAndCoordinatorTags) {
  EXPECT_EQ(SlurmLauncher::HandleOf("42"), "slurm:42");
  EXPECT_EQ(*SlurmLauncher::SlurmJobIdOf("slurm:42"), "42");
  for (const char* bad : {"pids:1,2", "slurm:", "slurm:4x2", "42"}) {
    EXPECT_FALSE(SlurmLauncher::SlurmJobIdOf(bad).ok()) << bad;
  }
  const std::string tag = SlurmLauncher::CoordinatorTag("host", "/var/lib/fitrun");
  EXPECT_EQ(tag, SlurmLauncher::CoordinatorTag("host", "/var/lib/fitrun"));
  EXPECT_NE(tag, SlurmLauncher::CoordinatorTag("host", "/var/lib/fitrun2"));
  EXPECT_NE(tag, SlurmLauncher::CoordinatorTag("other", "/var/lib/fitrun"));
  EXPECT_THAT(tag, ::testing::MatchesRegex("fitrund-[0-9a-f]{16}"));
}

}  // namespace
}  // namespace fitrun::server
