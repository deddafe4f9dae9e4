// Spawn with real children (/bin/sh): the environment on top of fitrund's, the working directory,
// standard streams to pipes or an appended file, stdin from /dev/null, a process group of its own,
// signals unblocked in the child, and how an ending is described.
#include "server/spawn/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/sandbox/throwaway_account.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

// Everything the child writes to `fd` until it closes it.
std::string ReadAll(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  return text;
}

// Runs `script` under /bin/sh with stdout to a pipe; returns what it printed and how it ended.
std::pair<std::string, ChildExit> RunShell(const std::string& script, SpawnOptions options = {}) {
  absl::StatusOr<Pipe> out = MakePipe();
  EXPECT_TRUE(out.ok());
  options.argv = {"/bin/sh", "-c", script};
  options.stdout_fd = out->write_end;
  absl::StatusOr<pid_t> pid = Spawn(options);
  CloseFd(&out->write_end);
  EXPECT_TRUE(pid.ok()) << pid.status();
  std::string printed = ReadAll(out->read_end);
  CloseFd(&out->read_end);
  return {printed, Reap(*pid)};
}

TEST(SpawnTest, ChildGetsFitrundsEnvironmentWithTheOptionsOnTop) {
  setenv("FITRUN_SPAWN_TEST_INHERITED", "from-fitrund", 1);
  setenv("FITRUN_SPAWN_TEST_OVERRIDDEN", "old", 1);
  SpawnOptions options;
  options.env = {{"FITRUN_SPAWN_TEST_OVERRIDDEN", "new"}, {"FITRUN_SPAWN_TEST_ADDED", "added"}};
  auto [printed, exit] = RunShell(
      "echo $FITRUN_SPAWN_TEST_INHERITED $FITRUN_SPAWN_TEST_OVERRIDDEN $FITRUN_SPAWN_TEST_ADDED", options);
  EXPECT_EQ(printed, "from-fitrund new added\n");
  EXPECT_EQ(exit.exit_code, 0);
}

TEST(SpawnTest, StartsInTheWorkingDirectoryWithStdinFromDevNull) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  SpawnOptions options;
  options.working_dir = dir.path();
  auto [printed, exit] = RunShell("pwd; cat; echo end", options);
  EXPECT_EQ(printed, options.working_dir + "\nend\n");
}

TEST(SpawnTest, OutputPathTakesStdoutAndStderrAppended) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("child.log");
  { std::ofstream(path) << "before\n"; }
  SpawnOptions options;
  options.argv = {"/bin/sh", "-c", "echo out; echo err >&2"};
  options.output_path = path;
  absl::StatusOr<pid_t> pid = Spawn(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(Reap(*pid).exit_code, 0);
  std::stringstream log;
  log << std::ifstream(path).rdbuf();
  EXPECT_EQ(log.str(), "before\nout\nerr\n");
}

TEST(SpawnTest, ASecretReachesOnlyTheChildOnItsDescriptor) {
  absl::StatusOr<Pipe> secret = MakePipe();
  ASSERT_TRUE(secret.ok());
  ASSERT_EQ(write(secret->write_end, "token-123", 9), 9);
  CloseFd(&secret->write_end);
  SpawnOptions options;
  options.secret_fd = secret->read_end;
  options.secret_target = 3;
  auto [printed, exit] = RunShell("cat <&3; echo; env | grep -c token-123", options);
  CloseFd(&secret->read_end);
  EXPECT_EQ(printed, "token-123\n0\n") << "on descriptor 3, and nowhere in the environment";
  EXPECT_EQ(exit.exit_code, 1) << "grep -c found nothing";
}

TEST(SpawnTest, ARanksLimitsAreItsOwnNotFitrunds) {
  SpawnOptions options;
  options.rank_limits = true;
  auto [printed, exit] = RunShell("ulimit -c; ulimit -n; ulimit -Hn", options);
  struct rlimit files {};
  getrlimit(RLIMIT_NOFILE, &files);
  const uint64_t expected =
      files.rlim_max == RLIM_INFINITY ? kRankOpenFiles : std::min<uint64_t>(files.rlim_max, kRankOpenFiles);
  EXPECT_EQ(printed, absl::StrCat("0\n", expected, "\n", expected, "\n"));
  EXPECT_EQ(exit.exit_code, 0);
}

TEST(SpawnTest, OwnProcessGroupOrFitrunds) {
  auto [own, own_exit] = RunShell("ps -o pgid= -p $$");
  EXPECT_EQ(std::stoi(own) != getpgrp(), true) << own;
  SpawnOptions shared;
  shared.own_process_group = false;
  auto [inherited, inherited_exit] = RunShell("ps -o pgid= -p $$", shared);
  EXPECT_EQ(std::stoi(inherited), getpgrp());
}

TEST(SpawnTest, SignalsBlockedInFitrundAreUnblockedInTheChild) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  auto [printed, exit] = RunShell("kill -TERM $$; sleep 5; echo survived");
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  EXPECT_EQ(printed, "");
  EXPECT_EQ(exit.signal, SIGTERM);
  EXPECT_EQ(exit.exit_code, -1);
  EXPECT_EQ(exit.Describe(), "was killed by signal 15");
}

TEST(SpawnTest, AWriteToAFullPipeGivesUpAtItsDeadline) {
  absl::StatusOr<Pipe> pipe = MakePipe();
  ASSERT_TRUE(pipe.ok());
  // What an owner's process does to a rank's pipe: fill it and never read.
  ASSERT_EQ(fcntl(pipe->write_end, F_SETFL, O_NONBLOCK), 0);
  const std::string chunk(4096, 'x');
  size_t filled = 0;
  for (ssize_t n; (n = write(pipe->write_end, chunk.data(), chunk.size())) > 0;) filled += static_cast<size_t>(n);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsDeadlineExceeded(WriteToPipeWithin(pipe->write_end, "identity", absl::Milliseconds(300))));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Seconds(3));

  // Read as it is written, more than a pipe holds goes whole.
  std::string drained;
  std::thread reader([&] { drained = ReadAll(pipe->read_end); });
  const std::string big(1 << 20, 'y');
  EXPECT_TRUE(WriteToPipeWithin(pipe->write_end, big, absl::Seconds(10)).ok());
  CloseFd(&pipe->write_end);
  reader.join();
  ASSERT_EQ(drained.size(), filled + big.size());  // nothing of the refused write went
  EXPECT_EQ(drained.substr(filled), big);
  CloseFd(&pipe->read_end);

  // A reader gone: false at once.
  absl::StatusOr<Pipe> closed = MakePipe();
  ASSERT_TRUE(closed.ok());
  CloseFd(&closed->read_end);
  signal(SIGPIPE, SIG_IGN);
  EXPECT_TRUE(absl::IsUnavailable(WriteToPipeWithin(closed->write_end, "identity", absl::Seconds(10))));
  CloseFd(&closed->write_end);
}

TEST(SpawnTest, ExitCodeIsReported) {
  auto [printed, exit] = RunShell("exit 3");
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_EQ(exit.Describe(), "exited with 3");
}

TEST(SpawnTest, MissingProgramNamesIt) {
  SpawnOptions options;
  options.argv = {"/nonexistent/program"};
  absl::StatusOr<pid_t> pid = Spawn(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("cannot start /nonexistent/program"), absl::string_view::npos)
      << pid.status();
  EXPECT_FALSE(Spawn(SpawnOptions{}).ok());
}


// ---- a child run as another account, and in a cgroup (root only: a throwaway account) ----

class SpawnAsAccountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!throwaway_.available()) GTEST_SKIP() << throwaway_.why();
    absl::StatusOr<UnixAccount> account = LookUpUnixAccount(throwaway_.name());
    ASSERT_TRUE(account.ok()) << account.status();
    account_ = *account;
    // A directory the account may write, reachable from /tmp (the test's own is under /root).
    ASSERT_TRUE(dir_.ok());
    chmod(dir_.path().c_str(), 0755);
    writable_ = dir_.Join("mine");
    mkdir(writable_.c_str(), 0700);
    ASSERT_EQ(chown(writable_.c_str(), account_.uid, account_.gid), 0);
  }
  ThrowawayAccount throwaway_{"fitrun-sp-"};
  UnixAccount account_;
  TempDir dir_{"fitrun-spawn-as-", "/tmp"};
  std::string writable_;
};

TEST_F(SpawnAsAccountTest, ChildHasTheAccountsIdsGroupsAndASessionOfItsOwn) {
  SpawnOptions options;
  options.run_as = account_;
  auto [printed, exit] = RunShell("echo $(id -u) $(id -g) $(id -G); ps -o sid= -p $$; echo $$", options);
  EXPECT_EQ(exit.exit_code, 0) << printed;
  std::istringstream lines(printed);
  std::string ids, sid, pid;
  std::getline(lines, ids);
  std::getline(lines, sid);
  std::getline(lines, pid);
  EXPECT_EQ(ids, absl::StrCat(account_.uid, " ", account_.gid, " ", account_.gid));
  EXPECT_EQ(std::stoi(sid), std::stoi(pid)) << "not the leader of its own session";
}

TEST_F(SpawnAsAccountTest, EnvironmentIsCleanWithTheOptionsOnTop) {
  setenv("FITRUN_SPAWN_TEST_SECRET", "fitrunds-own", 1);
  SpawnOptions options;
  options.run_as = account_;
  options.env = {{"FITRUN_SPAWN_TEST_ADDED", "added"}};
  auto [printed, exit] = RunShell("echo \"[$FITRUN_SPAWN_TEST_SECRET] $FITRUN_SPAWN_TEST_ADDED $USER $HOME\"", options);
  EXPECT_EQ(printed, absl::StrCat("[] added ", account_.name, " ", account_.home, "\n"));
}

TEST_F(SpawnAsAccountTest, NoDescriptorOfFitrundsIsInherited) {
  // A descriptor opened without close-on-exec, as a library might: still not the child's.
  const int leaked = open("/etc/hostname", O_RDONLY);
  ASSERT_GE(leaked, 3);
  SpawnOptions options;
  options.run_as = account_;
  auto [printed, exit] = RunShell("ls /proc/self/fd | sort -n | tr '\\n' ' '", options);
  close(leaked);
  // 0-2 and the descriptor ls reads /proc/self/fd with.
  EXPECT_EQ(printed, "0 1 2 3 ");
}

TEST_F(SpawnAsAccountTest, OutputFileIsOpenedAsTheAccount) {
  SpawnOptions options;
  options.run_as = account_;
  options.argv = {"/bin/sh", "-c", "echo hello"};
  options.output_path = writable_ + "/child.log";
  absl::StatusOr<pid_t> pid = Spawn(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(Reap(*pid).exit_code, 0);
  struct stat info {};
  ASSERT_EQ(stat(options.output_path.c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, account_.uid);

  // Where only root may write, the child cannot start, and the error says which step failed.
  options.output_path = dir_.Join("roots.log");
  absl::StatusOr<pid_t> refused = Spawn(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(absl::StrCat("as ", account_.name, ": opening its output file")),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(std::filesystem::exists(options.output_path));
}

TEST_F(SpawnAsAccountTest, AFifoOrALinkAtTheOutputPathIsRefusedWithoutWaiting) {
  // The account decides what is at its output path; a FIFO used to hold the child's open (and
  // fitrund, waiting for its exec) until a reader came.
  const std::string fifo = writable_ + "/rank-0.log";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_EQ(chown(fifo.c_str(), account_.uid, account_.gid), 0);
  const std::string link = writable_ + "/rank-1.log";
  ASSERT_EQ(symlink("/tmp", link.c_str()), 0);
  for (const std::string& path : {fifo, link}) {
    SpawnOptions options;
    options.run_as = account_;
    options.argv = {"/bin/true"};
    options.output_path = path;
    const absl::Time start = absl::Now();
    absl::StatusOr<pid_t> refused = Spawn(options);
    ASSERT_FALSE(refused.ok()) << path;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << path;
    EXPECT_NE(refused.status().message().find("opening its output file, which is a FIFO, a socket or a symbolic link"),
              std::string::npos)
        << refused.status();
  }
  // Without an account (posix_spawn) the open does not wait either.
  SpawnOptions options;
  options.argv = {"/bin/true"};
  options.output_path = fifo;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(Spawn(options).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(SpawnAsAccountTest, CannotRegainRoot) {
  SpawnOptions options;
  options.run_as = account_;
  // su and sudo are setuid programs: no_new_privs makes their bit inert.
  auto [printed, exit] = RunShell("grep NoNewPrivs /proc/self/status", options);
  EXPECT_EQ(printed, "NoNewPrivs:\t1\n");
}

TEST(SpawnCgroupTest, ChildJoinsTheCgroupBeforeItRuns) {
  const std::string cgroup = absl::StrCat("/sys/fs/cgroup/pids/fitrun-spawn-test-", getpid());
  if (geteuid() != 0 || mkdir(cgroup.c_str(), 0755) != 0) {
    GTEST_SKIP() << "needs root and a writable cgroup v1 pids controller at /sys/fs/cgroup/pids";
  }
  SpawnOptions options;
  options.cgroup_procs_files = {cgroup + "/cgroup.procs"};
  auto [printed, exit] = RunShell("grep pids: /proc/self/cgroup", options);
  EXPECT_NE(printed.find(absl::StrCat(":pids:/fitrun-spawn-test-", getpid(), "\n")), std::string::npos) << printed;
  rmdir(cgroup.c_str());

  options.cgroup_procs_files = {"/sys/fs/cgroup/pids/no-such-fitrun-cgroup/cgroup.procs"};
  options.argv = {"/bin/true"};
  absl::StatusOr<pid_t> refused = Spawn(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no-such-fitrun-cgroup"), std::string::npos) << refused.status();
}

TEST(SpawnCgroupTest, AChildThatDoesNotReachItsExecIsKilledAtTheDeadline) {
  // A frozen cgroup stops the child as it joins, before its exec: as a stalled file system would.
  const std::string cgroup = absl::StrCat("/sys/fs/cgroup/freezer/fitrun-spawn-test-", getpid());
  if (geteuid() != 0 || mkdir(cgroup.c_str(), 0755) != 0) {
    GTEST_SKIP() << "needs root and a writable cgroup v1 freezer at /sys/fs/cgroup/freezer";
  }
  auto write_file = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  };
  write_file(cgroup + "/freezer.state", "FROZEN");
  SpawnOptions options;
  options.argv = {"/bin/true"};
  options.cgroup_procs_files = {cgroup + "/cgroup.procs"};
  options.exec_deadline = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<pid_t> stalled = Spawn(options);
  const absl::Duration took = absl::Now() - start;
  write_file(cgroup + "/freezer.state", "THAWED");  // the killed child dies once thawed
  ASSERT_FALSE(stalled.ok());
  EXPECT_EQ(stalled.status().code(), absl::StatusCode::kDeadlineExceeded) << stalled.status();
  EXPECT_NE(stalled.status().message().find("did not reach its exec within 1s"), std::string::npos)
      << stalled.status();
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(5));
  // The child is gone: the cgroup empties and can be removed.
  const absl::Time waiting = absl::Now();
  while (rmdir(cgroup.c_str()) != 0 && absl::Now() - waiting < absl::Seconds(10)) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(std::filesystem::exists(cgroup)) << "the stalled child was not killed";
}

}  // namespace
}  // namespace fitrun::server
