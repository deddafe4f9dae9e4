#include "server/slurm/slurm_command.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server::slurm {
namespace {

using ::testing::HasSubstr;

// No child of this test process is left unreaped (a zombie) or running.
void ExpectNoChildren() {
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(RunSlurmCommandTest, ReturnsStdoutOfAProgramFoundOnPath) {
  absl::StatusOr<std::string> out = RunSlurmCommand({"echo", "NodeName=n1 State=IDLE"}, absl::Seconds(10));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "NodeName=n1 State=IDLE\n");
  ExpectNoChildren();
}

TEST(RunSlurmCommandTest, RunsAnAbsolutePathWithoutAShell) {
  absl::StatusOr<std::string> out = RunSlurmCommand({"/bin/echo", "$HOME", "a;b", "*"}, absl::Seconds(10));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "$HOME a;b *\n");
}

TEST(RunSlurmCommandTest, ReadsOutputLargerThanAPipeHolds) {
  // 1 MiB on stdout and some stderr at once: neither pipe may fill up and stall the child.
  absl::StatusOr<std::string> out = RunSlurmCommand(
      {"/bin/sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' x; head -c 200000 /dev/zero >&2"}, absl::Seconds(20));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->size(), 1048576u);
}

TEST(RunSlurmCommandTest, StdinIsDevNull) {
  absl::StatusOr<std::string> out = RunSlurmCommand({"/bin/cat"}, absl::Seconds(10));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "");
}

TEST(RunSlurmCommandTest, NonZeroExitIsUnavailableWithCommandLineAndStatus) {
  absl::StatusOr<std::string> out = RunSlurmCommand({"/bin/false"}, absl::Seconds(10));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(out.status().message(), HasSubstr("`/bin/false` exited with status 1"));
  ExpectNoChildren();
}

TEST(RunSlurmCommandTest, NonZeroExitCarriesTrimmedStderr) {
  absl::StatusOr<std::string> out = RunSlurmCommand(
      {"/bin/sh", "-c",
       "echo ignored; echo '  slurm_load_node error: Unable to contact slurm controller  ' >&2; exit 3"},
      absl::Seconds(10));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(out.status().message(),
            "`/bin/sh -c 'echo ignored; echo '  slurm_load_node error: Unable to contact slurm controller  ' >&2; "
            "exit 3'` exited with status 3: slurm_load_node error: Unable to contact slurm controller");
}

TEST(RunSlurmCommandTest, NonZeroExitWithOnlyStdoutQuotesStdout) {
  // `scontrol show node n9` prints "Node n9 not found" on stdout and exits 1.
  absl::StatusOr<std::string> out =
      RunSlurmCommand({"/bin/sh", "-c", "echo Node n9 not found; exit 1"}, absl::Seconds(10));
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("exited with status 1: Node n9 not found"));
}

TEST(RunSlurmCommandTest, MissingProgramIsNotFoundNamingItAndSlurmsClientTools) {
  absl::StatusOr<std::string> out = RunSlurmCommand({"fitrun-no-such-scontrol", "show", "node"}, absl::Seconds(10));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(out.status().message(), HasSubstr("fitrun-no-such-scontrol: not found on PATH"));
  EXPECT_THAT(out.status().message(), HasSubstr("slurm-wlm's client tools"));

  absl::StatusOr<std::string> absolute = RunSlurmCommand({"/nonexistent/scontrol"}, absl::Seconds(10));
  EXPECT_EQ(absolute.status().code(), absl::StatusCode::kNotFound);
}

TEST(RunSlurmCommandTest, ProgramOnlyInUsrBinIsFoundWithoutItOnPath) {
  const char* saved = std::getenv("PATH");
  const std::string path = saved != nullptr ? saved : "";
  setenv("PATH", "/nonexistent", 1);
  absl::StatusOr<std::string> out = RunSlurmCommand({"env"}, absl::Seconds(10));  // Debian: /usr/bin/env
  setenv("PATH", path.c_str(), 1);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("PATH=/nonexistent"));  // and the environment is passed on
}

TEST(RunSlurmCommandTest, TimeoutKillsAndReapsTheChildPromptly) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> out = RunSlurmCommand({"/bin/sleep", "10"}, absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(out.status().message(), HasSubstr("`/bin/sleep 10` did not finish within 200ms; killed it"));
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(5));
  ExpectNoChildren();
}

TEST(RunSlurmCommandTest, TimeoutAlsoKillsWhatTheCommandStarted) {
  // The shell starts a sleep that holds the pipes open, and tells its pid; both must be gone.
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string pid_file = dir.Join("grandchild.pid");
  absl::StatusOr<std::string> out =
      RunSlurmCommand({"/bin/sh", "-c", absl::StrCat("sleep 30 & echo $! > ", pid_file, "; wait")},
                      absl::Milliseconds(500));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDeadlineExceeded);
  std::ifstream in(pid_file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  pid_t grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &grandchild)) << text;
  // Killed by SIGKILL; once init reaps it, it is gone. Wait for that, up to 5 s.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (kill(grandchild, 0) == 0 && absl::Now() < deadline) {
    std::ifstream stat(absl::StrCat("/proc/", grandchild, "/stat"));
    std::string line;
    std::getline(stat, line);
    if (line.rfind(") Z") != std::string::npos) break;  // dead, waiting for its new parent to reap it
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::ifstream stat(absl::StrCat("/proc/", grandchild, "/stat"));
  std::string line;
  std::getline(stat, line);
  EXPECT_TRUE(line.empty() || line.rfind(") Z") != std::string::npos) << "grandchild still running: " << line;
  ExpectNoChildren();
}

TEST(RunSlurmCommandTest, ChildGetsDefaultSignalHandlingWhateverTheCallerBlocks) {
  // fitrund blocks SIGTERM in every thread; a Slurm client must still die of it.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  absl::StatusOr<std::string> out =
      RunSlurmCommand({"/bin/sh", "-c", "kill -TERM $$; echo survived"}, absl::Seconds(10));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(out.status().message(), HasSubstr("was killed by signal 15"));
}

TEST(RunSlurmCommandTest, ConcurrentCallsEachGetTheirOwnOutput) {
  constexpr int kThreads = 8;
  constexpr int kCallsEach = 10;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &wrong] {
      for (int i = 0; i < kCallsEach; ++i) {
        const std::string word = absl::StrCat("thread", t, "call", i);
        absl::StatusOr<std::string> out = RunSlurmCommand({"/bin/echo", word}, absl::Seconds(20));
        if (!out.ok() || *out != word + "\n") ++wrong[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
  ExpectNoChildren();
}

TEST(RunSlurmCommandTest, EmptyArgvIsInvalid) {
  EXPECT_EQ(RunSlurmCommand({}, absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RealSlurmRunnerTest, RunsTheCommand) {
  SlurmRunner runner = RealSlurmRunner(absl::Seconds(10));
  absl::StatusOr<std::string> out = runner({"/bin/echo", "ok"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "ok\n");
}

}  // namespace
}  // namespace fitrun::server::slurm
