// Retention on its own: the newest ended jobs are kept, the oldest beyond the bound let go (those
// that may not go yet are skipped and taken later), and a bound of 0 keeps everything.
#include "server/core/jobs/retention.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const auto kAny = [](const std::string&) { return true; };

absl::Time At(int seconds) { return absl::FromUnixSeconds(1000 + seconds); }

TEST(RetentionTest, KeepsTheNewestEndedJobsAndLetsTheOldestGoByWhenTheyEnded) {
  Retention retention(2);
  retention.Ended("j-000003", At(1), 3);  // submitted last, ended first
  retention.Ended("j-000001", At(2), 1);
  EXPECT_THAT(retention.TakeExcess(kAny), IsEmpty());
  retention.Ended("j-000002", At(3), 2);
  EXPECT_THAT(retention.TakeExcess(kAny), ElementsAre("j-000003"));
  EXPECT_EQ(retention.ended(), 2u);
  retention.Ended("j-000004", At(4), 4);
  retention.Ended("j-000005", At(5), 5);
  EXPECT_THAT(retention.TakeExcess(kAny), ElementsAre("j-000001", "j-000002"));
}

TEST(RetentionTest, AJobThatMayNotGoYetIsSkippedAndTakenLater) {
  Retention retention(2);
  retention.Ended("j-000001", At(1), 1);
  retention.Ended("j-000002", At(2), 2);
  retention.Ended("j-000003", At(3), 3);
  const auto not_the_first = [](const std::string& id) { return id != "j-000001"; };
  EXPECT_THAT(retention.TakeExcess(not_the_first), ElementsAre("j-000002"));
  retention.Ended("j-000004", At(4), 4);
  EXPECT_THAT(retention.TakeExcess(not_the_first), ElementsAre("j-000003"));
  EXPECT_THAT(retention.TakeExcess(kAny), IsEmpty()) << "two are kept";
  retention.Ended("j-000005", At(5), 5);
  EXPECT_THAT(retention.TakeExcess(kAny), ElementsAre("j-000001"));
  EXPECT_EQ(retention.ended(), 2u);
}

TEST(RetentionTest, ABoundOfZeroKeepsEveryJob) {
  Retention retention(0);
  for (int i = 0; i < 100; ++i) retention.Ended("j-" + std::to_string(i), At(i), i);
  EXPECT_THAT(retention.TakeExcess(kAny), IsEmpty());
}

}  // namespace
}  // namespace fitrun::server
