#include "proto/contract/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::contract {
namespace {

using ::testing::MatchesRegex;
using ::testing::SizeIs;

// Lines logged while it lives go into a pipe instead of standard error; Drain() returns them.
class CapturedLog {
 public:
  CapturedLog() {
    EXPECT_EQ(pipe2(fds_, O_CLOEXEC), 0);
    reader_ = std::thread([this] {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fds_[0], buffer, sizeof(buffer))) > 0) text_.append(buffer, static_cast<size_t>(n));
    });
    before_ = SetLogFd(fds_[1]);
  }
  ~CapturedLog() {
    if (reader_.joinable()) Drain();
  }

  std::string Drain() {
    SetLogFd(before_);
    close(fds_[1]);
    reader_.join();
    close(fds_[0]);
    return text_;
  }

 private:
  int fds_[2] = {-1, -1};
  int before_ = STDERR_FILENO;
  std::thread reader_;
  std::string text_;
};

TEST(LogTest, LineIsSeverityUtcMillisecondsProgramAndText) {
  const absl::Time time = absl::FromUnixMillis(1735787045678);  // 2025-01-02 03:04:05.678 UTC
  EXPECT_EQ(FormatLogLine(LogSeverity::kInfo, time, "fitrund", "serving on 127.0.0.1:7070"),
            "I 2025-01-02T03:04:05.678Z fitrund: serving on 127.0.0.1:7070\n");
  EXPECT_EQ(FormatLogLine(LogSeverity::kWarning, time, "fitrun-worker", "x"),
            "W 2025-01-02T03:04:05.678Z fitrun-worker: x\n");
  EXPECT_EQ(FormatLogLine(LogSeverity::kError, absl::FromUnixMillis(0), "p", "y"), "E 1970-01-01T00:00:00.000Z p: y\n");
}

TEST(LogTest, MessageIsOneLineWhateverItQuotes) {
  const absl::Time time = absl::FromUnixMillis(0);
  EXPECT_EQ(FormatLogLine(LogSeverity::kError, time, "p", "probe failed: line 1\nline 2\n"),
            "E 1970-01-01T00:00:00.000Z p: probe failed: line 1 | line 2\n");
}

TEST(LogTest, LogWritesFormattedLinesWithTheProgramNameAndTheTimeNow) {
  SetLogProgramName("fitrund");
  CapturedLog captured;
  const absl::Time before = absl::Now();
  LogInfo("serving on %s", std::string("127.0.0.1:7070"));
  LogWarning("job %s attempt %d: retrying", "j-000001", 2);
  LogError("lost %d bytes", 42);
  Log(LogSeverity::kInfo, "100% plain");
  const absl::Time after = absl::Now();
  const std::vector<std::string> lines = absl::StrSplit(captured.Drain(), '\n', absl::SkipEmpty());

  ASSERT_THAT(lines, SizeIs(4));
  const std::string stamp = "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z";
  EXPECT_THAT(lines[0], MatchesRegex("I " + stamp + " fitrund: serving on 127\\.0\\.0\\.1:7070"));
  EXPECT_THAT(lines[1], MatchesRegex("W " + stamp + " fitrund: job j-000001 attempt 2: retrying"));
  EXPECT_THAT(lines[2], MatchesRegex("E " + stamp + " fitrund: lost 42 bytes"));
  EXPECT_THAT(lines[3], MatchesRegex("I " + stamp + " fitrund: 100% plain"));

  absl::Time logged;
  std::string error;
  ASSERT_TRUE(absl::ParseTime("%Y-%m-%dT%H:%M:%E3SZ", lines[0].substr(2, 24), absl::UTCTimeZone(), &logged, &error))
      << error;
  EXPECT_GE(logged, absl::FromUnixMillis(absl::ToUnixMillis(before)));
  EXPECT_LE(logged, after);
}

TEST(LogTest, LinesFromThreadsDoNotInterleave) {
  SetLogProgramName("fitrund");
  CapturedLog captured;
  constexpr int kThreads = 8;
  constexpr int kLines = 200;
  const std::string filler(300, 'x');
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &filler] {
      for (int i = 0; i < kLines; ++i) LogWarning("thread %d line %d %s end", t, i, filler);
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::vector<std::string> lines = absl::StrSplit(captured.Drain(), '\n', absl::SkipEmpty());

  ASSERT_THAT(lines, SizeIs(kThreads * kLines));
  for (const std::string& line : lines) {
    EXPECT_THAT(line, MatchesRegex("W [^ ]+ fitrund: thread [0-9] line [0-9]+ x{300} end"));
  }
}

}  // namespace
}  // namespace fitrun::contract
