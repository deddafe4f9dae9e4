// CallQuota on its own: a burst, then the steady rate, per user; calls running at once; the error
// names the call and the limit and carries its reason.
#include "server/core/jobs/call_quota.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "server/core/errors.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

class CallQuotaTest : public ::testing::Test {
 protected:
  CallQuota::Options Options() {
    CallQuota::Options options;
    options.per_second = 2;
    options.burst = 4;
    options.concurrent = 2;
    options.clock = [this] { return now_; };
    return options;
  }
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(CallQuotaTest, ABurstThenTheSteadyRatePerUser) {
  CallQuota quota(Options());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(quota.Admit("mallory").ok()) << i;
  absl::StatusOr<CallQuota::Ticket> refused = quota.Admit("mallory");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("PlanJob: mallory called it more than 2 times a second"));
  EXPECT_EQ(refused.status().GetPayload(kReasonPayload).value_or(absl::Cord()), "PLANS_PER_USER_LIMIT");
  EXPECT_TRUE(quota.Admit("alice").ok()) << "another user's bucket is their own";
  now_ += absl::Milliseconds(500);
  EXPECT_TRUE(quota.Admit("mallory").ok());
  EXPECT_FALSE(quota.Admit("mallory").ok());
  now_ += absl::Seconds(60);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(quota.Admit("mallory").ok()) << "refilled to the burst, no more";
  EXPECT_FALSE(quota.Admit("mallory").ok());
}

TEST_F(CallQuotaTest, CallsRunningAtOnceAreBoundedUntilTheirTicketsGo) {
  CallQuota quota(Options());
  std::vector<CallQuota::Ticket> running;
  running.push_back(*quota.Admit("mallory"));
  running.push_back(*quota.Admit("mallory"));
  absl::StatusOr<CallQuota::Ticket> third = quota.Admit("mallory");
  ASSERT_FALSE(third.ok());
  EXPECT_THAT(third.status().message(), HasSubstr("has 2 running, as many as one user may run at once"));
  running.pop_back();
  EXPECT_TRUE(quota.Admit("mallory").ok());
}

}  // namespace
}  // namespace fitrun::server
