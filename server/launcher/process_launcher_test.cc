#include "server/launcher/process_launcher.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>

#include "absl/synchronization/notification.h"
#include "server/testing/read_file.h"

namespace fitrun::server {
namespace {

std::string TempPath(const std::string& name) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove(path);
  return path;
}

TEST(ProcessLauncherTest, RunsWithoutAShellWithEnvWorkingDirAndLog) {
  ProcessLauncher launcher;
  WorkerLaunch launch;
  launch.argv = {"/usr/bin/env"};
  launch.env = {{"FITRUN_PROBE", "value with spaces; $HOME"}};
  launch.working_dir = ::testing::TempDir();
  launch.log_path = TempPath("env.log");
  absl::Notification exited;
  WorkerExit result;
  ASSERT_TRUE(launcher.Launch(launch, [&](const WorkerExit& e) { result = e; exited.Notify(); }).ok());
  ASSERT_TRUE(exited.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(result.exit_code, 0);
  // Passed verbatim: no shell expanded it. The parent's environment is inherited too.
  EXPECT_NE(ReadFileForTest(launch.log_path).find("FITRUN_PROBE=value with spaces; $HOME"), std::string::npos);
  EXPECT_NE(ReadFileForTest(launch.log_path).find("PATH="), std::string::npos);
}

TEST(ProcessLauncherTest, ReportsExitCodes) {
  ProcessLauncher launcher;
  WorkerLaunch launch;
  launch.argv = {"/bin/sh", "-c", "echo failing >&2; exit 7"};
  launch.log_path = TempPath("exit.log");
  absl::Notification exited;
  WorkerExit result;
  ASSERT_TRUE(launcher.Launch(launch, [&](const WorkerExit& e) { result = e; exited.Notify(); }).ok());
  ASSERT_TRUE(exited.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(result.exit_code, 7);
  EXPECT_EQ(ReadFileForTest(launch.log_path), "failing\n");
}

TEST(ProcessLauncherTest, StopTerminatesAndKillsAfterGrace) {
  ProcessLauncher launcher;
  WorkerLaunch launch;
  // Ignores SIGTERM, so only the SIGKILL after the grace period ends it.
  const std::string ready = TempPath("stop.ready");
  launch.argv = {"/bin/sh", "-c", "trap '' TERM; touch " + ready + "; while true; do sleep 0.05; done"};
  launch.log_path = TempPath("stop.log");
  absl::Notification exited;
  WorkerExit result;
  absl::StatusOr<int> handle = launcher.Launch(launch, [&](const WorkerExit& e) { result = e; exited.Notify(); });
  ASSERT_TRUE(handle.ok());
  // Wait until the shell has installed its trap.
  const absl::Time ready_deadline = absl::Now() + absl::Seconds(10);
  while (!std::filesystem::exists(ready) && absl::Now() < ready_deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(std::filesystem::exists(ready));
  const absl::Time start = absl::Now();
  launcher.Stop(*handle, absl::Milliseconds(300));
  ASSERT_TRUE(exited.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(result.signal, SIGKILL);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
}

TEST(ProcessLauncherTest, KillIfStillRunningAfterLetsAnExitingWorkerFinishAndKillsOneThatDoesNot) {
  ProcessLauncher launcher;
  auto run = [&](const std::string& script, absl::Duration grace) {
    WorkerLaunch launch;
    launch.argv = {"/bin/sh", "-c", script};
    launch.log_path = TempPath("left-to-exit.log");
    absl::Notification exited;
    WorkerExit result;
    absl::StatusOr<int> handle = launcher.Launch(launch, [&](const WorkerExit& e) { result = e; exited.Notify(); });
    EXPECT_TRUE(handle.ok());
    if (handle.ok()) launcher.KillIfStillRunningAfter(*handle, grace);
    EXPECT_TRUE(exited.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return result;
  };
  // No SIGTERM: the worker's own exit code is what is seen.
  EXPECT_EQ(run("sleep 0.3; exit 3", absl::Seconds(10)).exit_code, 3);
  EXPECT_EQ(run("while true; do sleep 0.05; done", absl::Milliseconds(300)).signal, SIGKILL);
}

TEST(ProcessLauncherTest, MissingBinaryIsAnError) {
  ProcessLauncher launcher;
  WorkerLaunch launch;
  launch.argv = {"/nonexistent/fitrun-worker"};
  absl::StatusOr<int> handle = launcher.Launch(launch, [](const WorkerExit&) {});
  ASSERT_FALSE(handle.ok());
  EXPECT_NE(handle.status().message().find("cannot start /nonexistent/fitrun-worker"), absl::string_view::npos);
}

}  // namespace
}  // namespace fitrun::server
