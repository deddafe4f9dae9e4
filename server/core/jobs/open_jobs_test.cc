// Who has which jobs open: request ids mapped to the job they created (per owner, until an admission
// the store refused is undone), and the per-owner bound with its reason.
#include "server/core/jobs/open_jobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "server/core/errors.h"
#include "server/core/jobs/test_jobs.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

TEST(OpenJobsTest, ARequestIdNamesTheJobItCreatedPerOwnerUntilForgotten) {
  OpenJobs open_jobs;
  const fitrun::v1::Job job = JobOf("j-000001", "alice", "r1");
  EXPECT_FALSE(open_jobs.EarlierJob("alice", "r1").has_value());
  open_jobs.Remember(job);
  EXPECT_EQ(open_jobs.EarlierJob("alice", "r1"), "j-000001");
  EXPECT_FALSE(open_jobs.EarlierJob("bob", "r1").has_value()) << "request ids are per owner";
  EXPECT_FALSE(open_jobs.EarlierJob("alice", "").has_value()) << "no request id, no idempotency";
  open_jobs.Forget(job);
  EXPECT_FALSE(open_jobs.EarlierJob("alice", "r1").has_value());
}

TEST(OpenJobsTest, AnOwnersOpenJobsAreBoundedAndAnEndedOneMakesRoom) {
  OpenJobs open_jobs(/*max_per_owner=*/2);
  open_jobs.Opened("alice");
  open_jobs.Opened("alice");
  open_jobs.Opened("bob");
  const absl::Status full = open_jobs.CheckQuota("alice");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("jobs: alice has 2 jobs queued or running"));
  EXPECT_EQ(full.GetPayload(kReasonPayload).value_or(absl::Cord()), "JOBS_PER_USER_LIMIT");
  EXPECT_TRUE(open_jobs.CheckQuota("bob").ok());
  open_jobs.Closed("alice");
  EXPECT_TRUE(open_jobs.CheckQuota("alice").ok());
  open_jobs.Closed("carol");  // never opened: nothing to undo
  EXPECT_TRUE(open_jobs.CheckQuota("carol").ok());
}

TEST(OpenJobsTest, WithoutALimitEveryOwnerMayOpenAnyNumber) {
  OpenJobs open_jobs;
  for (int i = 0; i < 1000; ++i) open_jobs.Opened("alice");
  EXPECT_TRUE(open_jobs.CheckQuota("alice").ok());
}

}  // namespace
}  // namespace fitrun::server
