// Spawn with real children (/bin/sh): the environment on top of fitrund's, the working directory,
// standard streams to pipes or an appended file, stdin from /dev/null, a process group of its own,
// signals unblocked in the child, and how an ending is described.
#include "server/spawn/spawn.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

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
  SpawnOptions options;
  options.working_dir = std::filesystem::temp_directory_path().string();
  auto [printed, exit] = RunShell("pwd; cat; echo end", options);
  EXPECT_EQ(printed, options.working_dir + "\nend\n");
}

TEST(SpawnTest, OutputPathTakesStdoutAndStderrAppended) {
  const std::string path = (std::filesystem::path(testing::TempDir()) / "child.log").string();
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

}  // namespace
}  // namespace fitrun::server
