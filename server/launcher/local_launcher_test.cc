// LocalLauncher over real processes: an attempt's ranks start with the rendezvous it chose, exits are
// reported per rank, a rank is stopped through the attempt's handle, an attempt that cannot start
// whole leaves nothing running and reports nothing, and a recorded attempt is re-adopted.
#include "server/launcher/local_launcher.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace fitrun::server {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Exits per rank, as the launcher reports them.
class Exits {
 public:
  WorkerLauncher::RankExitCallback Callback() {
    return [this](int rank, const WorkerExit& exit) {
      absl::MutexLock lock(&mu_);
      exits_[rank] = exit;
    };
  }
  bool WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n] { return exits_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::map<int, WorkerExit> exits() {
    absl::MutexLock lock(&mu_);
    return exits_;
  }

 private:
  absl::Mutex mu_;
  std::map<int, WorkerExit> exits_;
};

AttemptLaunch Attempt(const std::string& name, std::vector<std::vector<std::string>> argvs) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  AttemptLaunch attempt{"j-000001", 2, {}};
  for (size_t rank = 0; rank < argvs.size(); ++rank) {
    WorkerLaunch launch;
    launch.job_id = attempt.job_id;
    launch.attempt = attempt.attempt;
    launch.rank = static_cast<int>(rank);
    launch.argv = argvs[rank];
    launch.env = {{"FITRUN_JOB_ID", "j-000001"}, {"FITRUN_ATTEMPT", "2"}, {"RANK", absl::StrCat(rank)}};
    launch.working_dir = dir;
    launch.log_path = absl::StrCat(dir, "/rank-", rank, ".log");
    attempt.ranks.push_back(std::move(launch));
  }
  return attempt;
}

TEST(LocalLauncherTest, RanksMeetAtTheChosenRendezvousAndExitPerRank) {
  LocalLauncher launcher([] { return 29555; });
  const std::vector<std::string> print = {"/bin/sh", "-c", "echo $RANK $MASTER_ADDR:$MASTER_PORT; exit $RANK"};
  AttemptLaunch attempt = Attempt("local-rendezvous", {print, print});
  Exits exits;
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(attempt, exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_EQ(launched->master_addr, "127.0.0.1");
  EXPECT_EQ(launched->master_port, 29555);
  ASSERT_EQ(launched->pids.size(), 2u);
  EXPECT_EQ(launched->handle, LocalLaunchHandle(launched->pids));
  ASSERT_TRUE(exits.WaitFor(2, absl::Seconds(10)));
  EXPECT_EQ(exits.exits()[0].exit_code, 0);
  EXPECT_EQ(exits.exits()[1].exit_code, 1);
  EXPECT_EQ(Slurp(attempt.ranks[0].log_path), "0 127.0.0.1:29555\n");
  EXPECT_EQ(Slurp(attempt.ranks[1].log_path), "1 127.0.0.1:29555\n");
}

TEST(LocalLauncherTest, StopsOneRankThroughTheHandle) {
  LocalLauncher launcher([] { return 29556; });
  const std::vector<std::string> sleep = {"/bin/sleep", "60"};
  Exits exits;
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(Attempt("local-stop", {sleep, sleep}), exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  launcher.Stop(launched->handle, 1, absl::Seconds(5));
  ASSERT_TRUE(exits.WaitFor(1, absl::Seconds(10)));
  EXPECT_EQ(exits.exits().count(1), 1u);
  EXPECT_EQ(exits.exits()[1].signal, SIGTERM);
  EXPECT_EQ(exits.exits().count(0), 0u);  // rank 0 still runs
  launcher.Stop(launched->handle, 0, absl::Seconds(5));
  ASSERT_TRUE(exits.WaitFor(2, absl::Seconds(10)));
}

TEST(LocalLauncherTest, AnAttemptThatCannotStartWholeLeavesNothingRunning) {
  LocalLauncher launcher([] { return 29557; });
  Exits exits;
  AttemptLaunch attempt = Attempt("local-partial", {{"/bin/sleep", "60"}, {}});  // rank 1 has no argv
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(attempt, exits.Callback());
  ASSERT_FALSE(launched.ok());
  EXPECT_NE(launched.status().message().find("rank 1"), std::string::npos) << launched.status();
  // Rank 0 was started, then killed; its exit is not reported (the attempt never started).
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(exits.exits().empty());
  const std::string comm = "sleep";
  bool left = false;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string text((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    std::ifstream environ(entry.path() / "environ");
    std::string env((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
    if (text.rfind("/bin/sleep", 0) == 0 && env.find("FITRUN_JOB_ID=j-000001") != std::string::npos &&
        env.find("MASTER_PORT=29557") != std::string::npos) {
      std::ifstream stat(entry.path() / "stat");
      std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
      left |= s.find(") Z ") == std::string::npos;  // a zombie awaiting its reaper is gone already
    }
  }
  EXPECT_FALSE(left) << "rank 0 of an attempt that never started is still running";
}

TEST(LocalLauncherTest, AdoptsTheRecordedRanksThatStillRun) {
  const std::vector<std::string> sleep = {"/bin/sleep", "60"};
  LocalLauncher first([] { return 29558; });
  Exits first_exits;
  absl::StatusOr<LaunchedAttempt> launched = first.Launch(Attempt("local-adopt", {sleep, sleep}), first_exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  first.Stop(launched->handle, 1, absl::Seconds(5));
  ASSERT_TRUE(first_exits.WaitFor(1, absl::Seconds(10)));

  // A second launcher (a restarted coordinator) takes over rank 0; rank 1 is gone, and a rank the
  // record says exited is not even looked at.
  LocalLauncher second;
  Exits exits;
  RecordedAttempt recorded{"j-000001", 2, launched->handle, launched->pids, {true, true}};
  EXPECT_EQ(second.Adopt(recorded, exits.Callback()), (std::vector<bool>{true, false}));
  RecordedAttempt wrong_attempt{"j-000001", 3, launched->handle, launched->pids, {true, false}};
  EXPECT_EQ(second.Adopt(wrong_attempt, exits.Callback()), (std::vector<bool>{false, false}));
  second.Stop(launched->handle, 0, absl::Seconds(5));
  ASSERT_TRUE(exits.WaitFor(1, absl::Seconds(10)));
  EXPECT_EQ(exits.exits().count(0), 1u);
}

}  // namespace
}  // namespace fitrun::server
