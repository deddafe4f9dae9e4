// LocalLauncher over real processes: an attempt's ranks start with the rendezvous it chose, exits are
// reported per rank, a rank is stopped through the attempt's handle, an attempt that cannot start
// whole leaves nothing running and reports nothing, and a recorded attempt is re-adopted. With job
// cgroups (as root): ranks in the attempt's cgroup with its limits, a double-forked daemon killed on
// release, an OOM kill reported with the rank's exit, a restarted launcher re-opening the cgroup,
// stale cgroups removed and nothing left behind.
#include "server/launcher/local_launcher.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/sandbox/throwaway_cgroups.h"
#include "server/spawn/spawn.h"
#include "server/testing/read_file.h"
#include "server/testing/wait.h"

namespace fitrun::server {
namespace {

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
  Exits exits;  // outlives the launcher, as in every test here: its going may still report exits
  LocalLauncher launcher([] { return 29555; });
  // Each rank lives until the test has read its start from /proc, then prints and exits.
  const std::string go = testing::TempDir() + "/local-rendezvous-go";
  std::filesystem::remove(go);
  const std::vector<std::string> print = {
      "/bin/sh", "-c",
      "while [ ! -e " + go + " ]; do sleep 0.01; done; echo $RANK $MASTER_ADDR:$MASTER_PORT; exit $RANK"};
  AttemptLaunch attempt = Attempt("local-rendezvous", {print, print});
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(attempt, exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_EQ(launched->master_addr, "127.0.0.1");
  EXPECT_EQ(launched->master_port, 29555);
  ASSERT_EQ(launched->pids.size(), 2u);
  EXPECT_EQ(*PidsInLocalLaunchHandle(launched->handle), launched->pids);
  EXPECT_EQ(*StartTicksInLocalLaunchHandle(launched->handle),
            (std::vector<int64_t>{ProcessStartTicks(launched->pids[0]), ProcessStartTicks(launched->pids[1])}))
      << "each rank's start, for a restarted fitrund to know it by";
  std::ofstream(go).put('\n');
  ASSERT_TRUE(exits.WaitFor(2, absl::Seconds(10)));
  EXPECT_EQ(exits.exits()[0].exit_code, 0);
  EXPECT_EQ(exits.exits()[1].exit_code, 1);
  EXPECT_EQ(ReadFileForTest(attempt.ranks[0].log_path), "0 127.0.0.1:29555\n");
  EXPECT_EQ(ReadFileForTest(attempt.ranks[1].log_path), "1 127.0.0.1:29555\n");
}

// Whether something listens on 127.0.0.1:`port`.
bool Listening(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return connected;
}

TEST(LocalLauncherTest, EachAttemptMeetsAtAStoreFitrundHoldsFromBeforeItsRanksUntilItsRelease) {
  Exits exits;
  LocalLauncher launcher{LocalLauncher::Options()};
  const std::vector<std::string> print = {
      "/bin/sh", "-c", "echo $MASTER_ADDR $TORCHELASTIC_USE_AGENT_STORE $TORCHELASTIC_RESTART_COUNT"};
  AttemptLaunch attempt = Attempt("local-store", {print, print});
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(attempt, exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  ASSERT_TRUE(exits.WaitFor(2, absl::Seconds(10)));
  // Every rank a client of the store (attempt 2: torchrun's restart count 1), which is up and held
  // though no rank hosts it.
  EXPECT_EQ(ReadFileForTest(attempt.ranks[0].log_path), "127.0.0.1 True 1\n");
  EXPECT_EQ(ReadFileForTest(attempt.ranks[1].log_path), "127.0.0.1 True 1\n");
  EXPECT_TRUE(Listening(launched->master_port));
  launcher.Release(launched->handle);
  EXPECT_FALSE(Listening(launched->master_port)) << "the attempt's rendezvous outlived its release";
}

TEST(LocalLauncherTest, StopsOneRankThroughTheHandle) {
  Exits exits;
  LocalLauncher launcher([] { return 29556; });
  const std::vector<std::string> sleep = {"/bin/sleep", "60"};
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
  Exits exits;
  LocalLauncher launcher([] { return 29557; });
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
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    const std::string text = ReadProcFile(pid, "cmdline");
    const std::string env = ReadProcFile(pid, "environ");
    if (text.rfind("/bin/sleep", 0) == 0 && env.find("FITRUN_JOB_ID=j-000001") != std::string::npos &&
        env.find("MASTER_PORT=29557") != std::string::npos) {
      const std::string s = ReadProcFile(pid, "stat");
      left |= !s.empty() && s.find(") Z ") == std::string::npos;  // a zombie awaiting its reaper is gone already
    }
  }
  EXPECT_FALSE(left) << "rank 0 of an attempt that never started is still running";
}

TEST(LocalLauncherTest, AdoptsTheRecordedRanksThatStillRun) {
  const std::vector<std::string> sleep = {"/bin/sleep", "60"};
  Exits first_exits;
  Exits exits;
  LocalLauncher first([] { return 29558; });
  absl::StatusOr<LaunchedAttempt> launched = first.Launch(Attempt("local-adopt", {sleep, sleep}), first_exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  first.Stop(launched->handle, 1, absl::Seconds(5));
  ASSERT_TRUE(first_exits.WaitFor(1, absl::Seconds(10)));

  // A second launcher (a restarted coordinator) takes over rank 0; rank 1 is gone, and a rank the
  // record says exited is not even looked at.
  LocalLauncher second{LocalLauncher::Options()};
  RecordedAttempt recorded{"j-000001", 2, launched->handle, launched->pids, {true, true}};
  EXPECT_EQ(second.Adopt(recorded, exits.Callback()), (std::vector<bool>{true, false}));
  RecordedAttempt wrong_attempt{"j-000001", 3, launched->handle, launched->pids, {true, false}};
  EXPECT_EQ(second.Adopt(wrong_attempt, exits.Callback()), (std::vector<bool>{false, false}));
  second.Stop(launched->handle, 0, absl::Seconds(5));
  ASSERT_TRUE(exits.WaitFor(1, absl::Seconds(10)));
  EXPECT_EQ(exits.exits().count(0), 1u);
}

// As root: a process with exactly `want` as its pid (/proc/sys/kernel/ns_last_pid), running
// /bin/sleep as `uid` with the rank's environment: what any account may start once the rank is gone
// and its pid free. -1 when another process on the machine took the pid first every time.
pid_t ImpostorWithPid(pid_t want, uid_t uid) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    {
      std::ofstream last("/proc/sys/kernel/ns_last_pid");
      last << want - 1;
    }
    const pid_t child = fork();
    if (child == 0) {
      if (getpid() != want) _exit(99);
      if (setgid(uid) != 0 || setuid(uid) != 0) _exit(98);
      char* const argv[] = {const_cast<char*>("/bin/sleep"), const_cast<char*>("60"), nullptr};
      char* const envp[] = {const_cast<char*>("FITRUN_JOB_ID=j-000001"), const_cast<char*>("FITRUN_ATTEMPT=2"),
                            const_cast<char*>("RANK=0"), nullptr};
      execve("/bin/sleep", argv, envp);
      _exit(97);
    }
    if (child == want) return child;
    waitpid(child, nullptr, 0);
  }
  return -1;
}

TEST(LocalLauncherTest, AProcessThatTookARanksPidIsNotAdoptedWhateverItsEnvironment) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to choose a process's pid";
  for (const uid_t impostor_uid : {uid_t{65534}, uid_t{0}}) {  // another account; fitrund's own, later
    Exits first_exits;
    LocalLauncher first([] { return 29565; });
    absl::StatusOr<LaunchedAttempt> launched =
        first.Launch(Attempt("local-impostor", {{"/bin/sleep", "60"}}), first_exits.Callback());
    ASSERT_TRUE(launched.ok()) << launched.status();
    const pid_t rank = launched->pids[0];
    first.Stop(launched->handle, 0, absl::ZeroDuration());
    ASSERT_TRUE(first_exits.WaitFor(1, absl::Seconds(10)));
    // /proc counts a process's start in clock ticks (10 ms): an impostor started within the rank's
    // own tick would share its start time, which no check by /proc can tell apart. A pid comes round
    // again far later than that; here it is taken at once, so the test lets two ticks pass first.
    absl::SleepFor(absl::Milliseconds(25));
    const pid_t impostor = ImpostorWithPid(rank, impostor_uid);
    if (impostor < 0) GTEST_SKIP() << "pid " << rank << " was taken by another process first";
    Exits exits;
    LocalLauncher second{LocalLauncher::Options()};
    RecordedAttempt recorded{"j-000001", 2, launched->handle, launched->pids, {true}};
    EXPECT_EQ(second.Adopt(recorded, exits.Callback()), std::vector<bool>{false})
        << "adopted a process of uid " << impostor_uid << " that took the rank's pid";
    kill(impostor, SIGKILL);
    waitpid(impostor, nullptr, 0);
  }
}

// ---- with job cgroups (root) ----

class LocalLauncherCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!throwaway_.available()) GTEST_SKIP() << throwaway_.why();
  }
  void TearDown() override {
    if (!throwaway_.available()) return;
    for (int pid : stray_) {
      if (!ProcessGone(pid)) kill(pid, SIGKILL);
    }
    EXPECT_EQ(throwaway_.Leftovers(), std::vector<std::string>{}) << "a cgroup was left behind";
    throwaway_.Clear();
  }
  LocalLauncher::Options WithCgroups(int port) {
    LocalLauncher::Options options;
    options.pick_master_port = [port] { return port; };
    options.cgroups = throwaway_.cgroups();
    return options;
  }
  // The attempt's cgroup is gone (released).
  bool Released() { return absl::IsNotFound(throwaway_.cgroups()->Open("j-000001-a2").status()); }
  // A rank script's daemon: setsid, its parent gone, its pid written to `pid_file`.
  static std::string Daemon(const std::string& pid_file) {
    return absl::StrCat("setsid /bin/sh -c 'sleep 300 & echo $! > ", pid_file, "'; ");
  }
  int WaitForPid(const std::string& pid_file) {
    EXPECT_TRUE(WaitUntil([&] { return !ReadFileForTest(pid_file).empty(); })) << pid_file;
    const int pid = ReadFileForTest(pid_file).empty() ? 0 : std::stoi(ReadFileForTest(pid_file));
    if (pid > 0) stray_.push_back(pid);
    return pid;
  }

  ThrowawayCgroups throwaway_{"launcher"};
  std::vector<int> stray_;
};

TEST_F(LocalLauncherCgroupTest, AReleaseThatFailsIsTriedAgainUntilTheCgroupIsGone) {
  // The first two tries fail, as a kill that left a process behind would.
  std::atomic<int> tries{0};
  LocalLauncher::Options options = WithCgroups(29500);
  options.retry_after = absl::Milliseconds(50);
  options.kill_and_remove = [&tries](JobCgroup& cgroup) -> absl::Status {
    if (++tries <= 2) return absl::DeadlineExceededError("still has processes after 10s of killing");
    return LocalLauncher::KillAndRemove(cgroup);
  };
  Exits exits;
  LocalLauncher launcher(options);
  AttemptLaunch attempt = Attempt("cgroup-retry", {{"/bin/sleep", "300"}});
  attempt.host_memory_limit_bytes = 256 << 20;
  attempt.max_processes = 64;
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(attempt, exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  launcher.Release(launched->handle);
  EXPECT_TRUE(WaitUntil([&] { return Released(); }));
  EXPECT_EQ(tries.load(), 3);
  ASSERT_TRUE(exits.WaitFor(1, absl::Seconds(10))) << "the rank was killed with its cgroup";
}

TEST_F(LocalLauncherCgroupTest, RanksRunInTheAttemptsCgroupWithItsLimitsAndReleaseKillsWhatTheyLeft) {
  Exits exits;
  LocalLauncher launcher(WithCgroups(29560));
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "cgroup-release").string();
  const std::string pid_file = dir + "/daemon.pid";
  AttemptLaunch attempt = Attempt("cgroup-release", {{"/bin/sh", "-c", Daemon(pid_file) + "exec sleep 300"},
                                                     {"/bin/sleep", "300"}});
  attempt.host_memory_limit_bytes = 512 << 20;
  attempt.max_processes = 64;
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(attempt, exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  const int daemon = WaitForPid(pid_file);
  ASSERT_GT(daemon, 0);

  absl::StatusOr<std::unique_ptr<JobCgroup>> cgroup = throwaway_.cgroups()->Open("j-000001-a2");
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  EXPECT_EQ((*cgroup)->ReadLimits()->memory_bytes, 512 << 20);
  EXPECT_EQ((*cgroup)->ReadLimits()->max_tasks, 64);
  std::vector<int> pids = *(*cgroup)->Pids();
  for (int pid : {launched->pids[0], launched->pids[1], daemon}) {
    EXPECT_NE(std::find(pids.begin(), pids.end(), pid), pids.end()) << pid << " is not in the attempt's cgroup";
  }

  // Stopping the ranks (their process groups) leaves the daemon running; releasing the attempt does not.
  launcher.Stop(launched->handle, 0, absl::Seconds(5));
  launcher.Stop(launched->handle, 1, absl::Seconds(5));
  ASSERT_TRUE(exits.WaitFor(2, absl::Seconds(10)));
  EXPECT_FALSE(exits.exits()[0].host_memory_oom);
  EXPECT_FALSE(ProcessGone(daemon)) << "the process group stop reached the daemon: the test proves nothing";
  launcher.Release(launched->handle);
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(daemon); }));
  EXPECT_TRUE(WaitUntil([&] { return Released(); }));
  launcher.Release(launched->handle);  // once is enough; again does nothing
}

TEST_F(LocalLauncherCgroupTest, ARankTheOomKillerStoppedSaysSoWithTheLimitAndThePeak) {
  Exits exits;
  LocalLauncher launcher(WithCgroups(29561));
  AttemptLaunch attempt = Attempt(
      "cgroup-oom", {{"/usr/bin/python3", "-c", "import time; x = b'x' * (512 << 20); time.sleep(60)"},
                     {"/bin/sleep", "300"}});
  attempt.host_memory_limit_bytes = 96 << 20;
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(attempt, exits.Callback());
  ASSERT_TRUE(launched.ok()) << launched.status();
  ASSERT_TRUE(exits.WaitFor(1, absl::Seconds(20)));
  const WorkerExit hog = exits.exits().at(0);
  EXPECT_EQ(hog.signal, SIGKILL);
  EXPECT_TRUE(hog.host_memory_oom);
  EXPECT_EQ(hog.host_memory_limit_bytes, 96 << 20);
  EXPECT_GT(hog.host_memory_peak_bytes, 64 << 20);
  // The kill is reported once: the peer stopped afterwards did not run out of anything.
  launcher.Stop(launched->handle, 1, absl::Seconds(5));
  ASSERT_TRUE(exits.WaitFor(2, absl::Seconds(10)));
  EXPECT_FALSE(exits.exits().at(1).host_memory_oom);
  launcher.Release(launched->handle);
  EXPECT_TRUE(WaitUntil([&] { return Released(); }));
}

TEST_F(LocalLauncherCgroupTest, ARestartedLauncherReopensTheCgroupOfTheRanksItAdopts) {
  // What the coordinator before the restart left: a rank in the attempt's cgroup, with a daemon.
  absl::StatusOr<std::unique_ptr<JobCgroup>> before = throwaway_.cgroups()->Make("j-000001-a2", {256 << 20, 64});
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "cgroup-adopt").string();
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir + "/daemon.pid");
  SpawnOptions rank;
  rank.argv = {"/bin/sh", "-c", Daemon(dir + "/daemon.pid") + "exec sleep 300"};
  rank.env = {{"FITRUN_JOB_ID", "j-000001"}, {"FITRUN_ATTEMPT", "2"}, {"RANK", "0"}};
  rank.cgroup_procs_files = (*before)->ProcsFiles();
  absl::StatusOr<pid_t> pid = Spawn(rank);
  ASSERT_TRUE(pid.ok()) << pid.status();
  stray_.push_back(*pid);
  const int daemon = WaitForPid(dir + "/daemon.pid");

  absl::StatusOr<std::unique_ptr<JobCgroups>> restarted = JobCgroups::Create(throwaway_.options());
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  LocalLauncher::Options options = WithCgroups(29562);
  options.cgroups = restarted->get();
  Exits exits;
  LocalLauncher launcher(options);
  const std::string handle = LocalLaunchHandle({*pid});
  RecordedAttempt recorded{"j-000001", 2, handle, {*pid}, {true}};
  EXPECT_EQ(launcher.Adopt(recorded, exits.Callback()), std::vector<bool>{true});
  launcher.ReleaseUnowned({handle});
  launcher.Stop(handle, 0, absl::Seconds(5));
  ASSERT_TRUE(exits.WaitFor(1, absl::Seconds(10)));
  EXPECT_FALSE(Released()) << "an adopted attempt's cgroup is not stale";
  EXPECT_FALSE(ProcessGone(daemon));
  launcher.Release(handle);
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(daemon); }));
  EXPECT_TRUE(WaitUntil([&] { return Released(); }));
  EXPECT_EQ(Reap(*pid).signal, SIGTERM);
  stray_.clear();
}

TEST(LocalLaunchHandleTest, AWarmRanksIdFollowsItsPidAndBothComeBack) {
  const std::string handle = LocalLaunchHandle({101, 102, 103}, {"", "9f3a", ""});
  EXPECT_EQ(handle, "pids:101,102~9f3a,103");
  EXPECT_EQ(*PidsInLocalLaunchHandle(handle), (std::vector<int>{101, 102, 103}));
  EXPECT_EQ(*WarmIdsInLocalLaunchHandle(handle), (std::vector<std::string>{"", "9f3a", ""}));
  EXPECT_EQ(LocalLaunchHandle({7, 8}), "pids:7,8") << "no warm rank: the handle as it always was";
  const std::string started = LocalLaunchHandle({7, 8}, {"", "ab"}, {1234, 5678});
  EXPECT_EQ(started, "pids:7@1234,8@5678~ab");
  EXPECT_EQ(*StartTicksInLocalLaunchHandle(started), (std::vector<int64_t>{1234, 5678}));
  EXPECT_EQ(*WarmIdsInLocalLaunchHandle(started), (std::vector<std::string>{"", "ab"}));
  EXPECT_EQ(*StartTicksInLocalLaunchHandle("pids:7,8"), (std::vector<int64_t>{0, 0})) << "an older fitrund's";
  EXPECT_FALSE(PidsInLocalLaunchHandle("pids:x~1").ok());
  EXPECT_FALSE(WarmIdsInLocalLaunchHandle("slurm:42").ok());
}

TEST_F(LocalLauncherCgroupTest, ReleaseUnownedRemovesOnlyCgroupsNoAttemptHolds) {
  // A stale attempt's cgroup with a process still in it, and a live probe of this fitrund's.
  absl::StatusOr<std::unique_ptr<JobCgroup>> stale = throwaway_.cgroups()->Make("j-000009-a1", {});
  ASSERT_TRUE(stale.ok()) << stale.status();
  SpawnOptions left;
  left.argv = {"/bin/sleep", "300"};
  left.cgroup_procs_files = (*stale)->ProcsFiles();
  absl::StatusOr<pid_t> pid = Spawn(left);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const std::string probe = absl::StrCat("probe-", getpid(), "-0");
  ASSERT_TRUE(throwaway_.cgroups()->Make(probe, {}).ok());

  LocalLauncher launcher(WithCgroups(29563));
  launcher.ReleaseUnowned({});
  EXPECT_EQ(Reap(*pid).signal, SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return absl::IsNotFound(throwaway_.cgroups()->Open("j-000009-a1").status()); }));
  EXPECT_EQ(throwaway_.cgroups()->List(), std::vector<std::string>{probe});
  ASSERT_TRUE((*throwaway_.cgroups()->Open(probe))->Remove().ok());
}

TEST_F(LocalLauncherCgroupTest, ALauncherThatGoesTakesEverythingInItsCgroupsWithIt) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "cgroup-destroy").string();
  const std::string pid_file = dir + "/daemon.pid";
  int daemon = 0;
  {
    Exits exits;  // outlives the launcher, whose going reports the rank's exit
    LocalLauncher launcher(WithCgroups(29564));
    absl::StatusOr<LaunchedAttempt> launched =
        launcher.Launch(Attempt("cgroup-destroy", {{"/bin/sh", "-c", Daemon(pid_file) + "exec sleep 300"}}),
                        exits.Callback());
    ASSERT_TRUE(launched.ok()) << launched.status();
    daemon = WaitForPid(pid_file);
  }
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(daemon); }));
  EXPECT_TRUE(Released());
}

}  // namespace
}  // namespace fitrun::server
