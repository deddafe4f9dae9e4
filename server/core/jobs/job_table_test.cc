#include "server/core/jobs/job_table.h"

#include <gtest/gtest.h>

#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/recording_metrics.h"

namespace fitrun::server {
namespace {

class JobTableTest : public ::testing::Test {
 protected:
  JobTable MakeTable(int max_open_per_owner, int64_t retain) {
    return JobTable(JobTable::Options{max_open_per_owner, retain, [this] { return now_; }}, &store_, &hub_,
                    &metrics_);
  }
  JobEntry NewJob(const std::string& owner) {
    JobEntry entry;
    entry.record.job.set_owner(owner);
    *entry.record.job.mutable_created_at() = google::protobuf::Timestamp();
    return entry;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  FakeJobStore store_;
  EventHub hub_;
  RecordingMetrics metrics_;
};

TEST_F(JobTableTest, AnAdmittedJobIsNumberedStoredAndQueuedWithItsFirstEvent) {
  JobTable table = MakeTable(0, 0);
  absl::StatusOr<JobEntry*> first = table.Admit(NewJob("alice"), "submitted");
  absl::StatusOr<JobEntry*> second = table.Admit(NewJob("alice"), "submitted");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ((*first)->record.job.id(), "j-000001");
  EXPECT_EQ((*second)->record.job.id(), "j-000002");
  EXPECT_EQ((*first)->record.job.state(), fitrun::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(store_.job_count(), 2u);
  EXPECT_EQ(store_.event_count("j-000001"), 1u);
  EXPECT_EQ(table.ids_by_order().size(), 2u);
  EXPECT_EQ(table.Find("j-000002"), *second);
  EXPECT_EQ(table.Find("j-000003"), nullptr);
}

TEST_F(JobTableTest, AJobTheStoreRefusesWasNeverAdmitted) {
  JobTable table = MakeTable(0, 0);
  store_.FailPuts(absl::UnavailableError("disk full"));
  absl::StatusOr<JobEntry*> refused = table.Admit(NewJob("alice"), "submitted");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(table.jobs().empty());
  EXPECT_TRUE(table.ids_by_order().empty());
  EXPECT_EQ(hub_.LastSequence("j-000001"), 0) << "no watcher saw a job that does not exist";
  // Nor does it count against its owner.
  store_.FailPuts(absl::OkStatus());
  JobTable bounded = MakeTable(1, 0);
  store_.FailPuts(absl::UnavailableError("disk full"));
  ASSERT_FALSE(bounded.Admit(NewJob("bob"), "submitted").ok());
  store_.FailPuts(absl::OkStatus());
  EXPECT_TRUE(bounded.open_jobs().CheckQuota("bob").ok());
}

TEST_F(JobTableTest, OnlyAllowedMovesChangeAStateAndAnEndedJobFreesItsOwnersRoom) {
  JobTable table = MakeTable(1, 0);
  JobEntry& job = **table.Admit(NewJob("alice"), "submitted");
  EXPECT_FALSE(table.open_jobs().CheckQuota("alice").ok()) << "one open job is alice's limit";
  const absl::Status skipped = table.Transition(job, fitrun::v1::JOB_STATE_SUCCEEDED, "never ran");
  EXPECT_EQ(skipped.code(), absl::StatusCode::kFailedPrecondition) << skipped;
  EXPECT_EQ(job.record.job.state(), fitrun::v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(table.Transition(job, fitrun::v1::JOB_STATE_CANCELLED, "not needed").ok());
  EXPECT_TRUE(job.record.job.has_finished_at());
  EXPECT_TRUE(table.open_jobs().CheckQuota("alice").ok());
  EXPECT_FALSE(table.Transition(job, fitrun::v1::JOB_STATE_PLANNING, "again").ok()) << "an end is final";
  // Every change is an event in order, stored before any watcher reads it.
  EXPECT_EQ(store_.event_count(job.record.job.id()), 2u);
  EXPECT_EQ(hub_.LastSequence(job.record.job.id()), 2);
}

TEST_F(JobTableTest, AnAdmittedOrEndedJobAsksTheSchedulerForAPassButAMoveBetweenOpenStatesDoesNot) {
  JobTable table = MakeTable(0, 0);
  EXPECT_FALSE(table.pass_requested());
  JobEntry& job = **table.Admit(NewJob("alice"), "submitted");
  EXPECT_TRUE(table.TakePassRequest()) << "a new job waits for placement";
  EXPECT_FALSE(table.TakePassRequest()) << "a request is taken once";
  ASSERT_TRUE(table.Transition(job, fitrun::v1::JOB_STATE_PLANNING, "devices are free").ok());
  EXPECT_FALSE(table.pass_requested());
  ASSERT_TRUE(table.Transition(job, fitrun::v1::JOB_STATE_FAILED, "planning failed").ok());
  EXPECT_TRUE(table.TakePassRequest()) << "an ended job frees its owner's room and may be forgotten";
  EXPECT_FALSE(table.Transition(job, fitrun::v1::JOB_STATE_CANCELLED, "again").ok());
  EXPECT_FALSE(table.pass_requested()) << "a refused move changes nothing";
  table.RequestPass();
  EXPECT_TRUE(table.TakePassRequest());
}

TEST_F(JobTableTest, EndedJobsBeyondTheRetentionAreForgottenButNeverOneWithAnAttempt) {
  JobTable table = MakeTable(0, 1);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    JobEntry& job = **table.Admit(NewJob("alice"), "submitted");
    ids.push_back(job.record.job.id());
    if (i < 3) {
      now_ += absl::Seconds(1);
      ASSERT_TRUE(table.Transition(job, fitrun::v1::JOB_STATE_CANCELLED, "done").ok());
    }
  }
  // The oldest ended job's ranks may still be stopping: kept while it has an attempt, and the one
  // ended job the retention keeps.
  table.Find(ids[0])->active.emplace();
  const std::vector<std::string> forgotten = table.ForgetExcess();
  EXPECT_EQ(forgotten, (std::vector<std::string>{ids[1], ids[2]}));
  EXPECT_EQ(table.Find(ids[1]), nullptr);
  EXPECT_EQ(table.Find(ids[2]), nullptr);
  EXPECT_NE(table.Find(ids[0]), nullptr);
  EXPECT_NE(table.Find(ids[3]), nullptr) << "a job still queued is never forgotten";
  EXPECT_EQ(store_.job_count(), 4u) << "the rows are the caller's to delete, outside the lock";
}

TEST_F(JobTableTest, ARestoredJobKeepsItsNumberAndTheNextOneFollowsIt) {
  JobTable table = MakeTable(0, 0);
  JobRecord record;
  record.submit_order = 41;
  record.job.set_id("j-000041");
  record.job.set_state(fitrun::v1::JOB_STATE_QUEUED);
  record.job.set_last_sequence(7);
  JobEntry& restored = table.Restore(record);
  table.RestoreDone(restored);
  EXPECT_EQ(hub_.NextSequence("j-000041"), 8);
  EXPECT_EQ((*table.Admit(NewJob("alice"), "submitted"))->record.job.id(), "j-000042");
}

TEST_F(JobTableTest, PagesWalkTheVisibleJobsOnceInSubmissionOrder) {
  JobTable table = MakeTable(0, 0);
  for (const char* owner : {"alice", "bob", "alice", "alice", "bob"}) ASSERT_TRUE(table.Admit(NewJob(owner), "s").ok());
  ASSERT_TRUE(table.Transition(*table.Find("j-000003"), fitrun::v1::JOB_STATE_CANCELLED, "done").ok());
  const auto alices = [](const fitrun::v1::Job& job) { return job.owner() == "alice"; };
  JobTable::Page first = table.ListPage({}, 0, 2, alices);
  ASSERT_EQ(first.jobs.size(), 2u);
  EXPECT_EQ(first.jobs[0].id(), "j-000001");
  EXPECT_EQ(first.jobs[1].id(), "j-000003");
  JobTable::Page second = table.ListPage({}, first.next_order, 2, alices);
  ASSERT_EQ(second.jobs.size(), 1u);
  EXPECT_EQ(second.jobs[0].id(), "j-000004");
  EXPECT_EQ(second.next_order, 0) << "nothing more follows";
  const std::vector<fitrun::v1::Job> queued = table.List({fitrun::v1::JOB_STATE_QUEUED});
  ASSERT_EQ(queued.size(), 4u);
  EXPECT_EQ(queued.back().id(), "j-000005");
}

}  // namespace
}  // namespace fitrun::server
