#include "server/testing/wait.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace fitrun::server {
namespace {

TEST(WaitTest, WaitUntilReturnsOnceTheConditionHolds) {
  std::atomic<bool> set{false};
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    set = true;
  });
  EXPECT_TRUE(WaitUntil([&] { return set.load(); }, absl::Seconds(10)));
  setter.join();
}

TEST(WaitTest, WaitUntilGivesUpAfterItsTimeout) {
  const absl::Time start = absl::Now();
  EXPECT_FALSE(WaitUntil([] { return false; }, absl::Milliseconds(100)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
}

TEST(WaitTest, AProcessIsGoneOnceItEndsEvenBeforeItIsReaped) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  EXPECT_FALSE(ProcessGone(child));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(child); }));  // a zombie until reaped
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(ProcessGone(child));
}

}  // namespace
}  // namespace fitrun::server
