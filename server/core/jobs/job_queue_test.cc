#include "server/core/jobs/job_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace fitrun::server {
namespace {

JobRecord Record(int64_t order, int priority, int attempts) {
  JobRecord record;
  record.submit_order = order;
  record.job.mutable_spec()->set_priority(priority);
  record.job.set_attempts(attempts);
  return record;
}

TEST(JobQueueTest, RestartingJobsFirstThenPriorityThenSubmissionOrder) {
  std::vector<JobRecord> records = {Record(1, 0, 0), Record(2, 5, 0), Record(3, 0, 1), Record(4, 5, 0),
                                    Record(5, 9, 2)};
  std::sort(records.begin(), records.end(), RunsBefore);
  std::vector<int64_t> order;
  for (const JobRecord& r : records) order.push_back(r.submit_order);
  EXPECT_EQ(order, (std::vector<int64_t>{5, 3, 2, 4, 1}));
}

TEST(JobQueueTest, WhichJobsWaitForAPlacement) {
  fitrun::v1::Job job;
  job.set_state(fitrun::v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(WaitsForPlacement(job, false));
  job.set_state(fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_TRUE(WaitsForPlacement(job, false));
  EXPECT_FALSE(WaitsForPlacement(job, true));  // its old ranks are still stopping
  job.set_state(fitrun::v1::JOB_STATE_PLANNING);
  EXPECT_TRUE(WaitsForPlacement(job, false));
  job.set_state(fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(WaitsForPlacement(job, false));
  job.set_state(fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(WaitsForPlacement(job, false));
}

}  // namespace
}  // namespace fitrun::server
