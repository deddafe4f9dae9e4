// A rank's hello and reports on their own: no manager, no stream, no threads.
#include "server/core/jobs/worker_sessions.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server/core/jobs/rooms_testing.h"

namespace fitrun::server {
namespace {

class RecordingConnection : public WorkerConnection {
 public:
  void SendStop(const std::string& reason) override { stops.push_back(reason); }
  std::vector<std::string> stops;
};

class WorkerSessionsTest : public ::testing::Test {
 protected:
  // A job running attempt 1 with two ranks, its token "secret".
  JobEntry& RunningJob() {
    fitrun::v1::JobSpec spec;
    spec.mutable_fault_tolerance()->set_max_oom_retries(2);
    JobEntry& entry = rooms_.PlanningJob(spec, "secret");
    rooms_.Run(RoomsForTest::OnTwoDevices(entry, /*per_device_batch=*/64));
    EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING);
    return entry;
  }
  static fitrun::v1::Hello HelloOf(const std::string& job_id, const std::string& token, int attempt, int rank) {
    fitrun::v1::Hello hello;
    hello.set_job_id(job_id);
    hello.set_job_token(token);
    hello.set_attempt(attempt);
    hello.set_rank(rank);
    return hello;
  }

  RoomsForTest rooms_;
  FakeWorkerLauncher& launcher_ = rooms_.launcher;
  WorkerSessions sessions_{&rooms_.table, &rooms_.attempts, &rooms_.run_memory, &rooms_.metrics,
                           [this] { return rooms_.now; }, ReportIngest::Options{}};
};

TEST_F(WorkerSessionsTest, AWrongTokenAndAMissingJobGetTheSameAnswer) {
  JobEntry& entry = RunningJob();
  const std::string id = entry.record.job.id();
  absl::StatusOr<WorkerKey> wrong = sessions_.Attach(HelloOf(id, "secreT", 1, 0), {});
  absl::StatusOr<WorkerKey> missing = sessions_.Attach(HelloOf("j-999999", "secret", 1, 0), {});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status(), missing.status()) << "a caller learns neither which jobs exist nor what it guessed";
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sessions_.Attach(HelloOf(id, "secret", 2, 0), {}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sessions_.Attach(HelloOf(id, "secret", 1, 2), {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerSessionsTest, AnAttachedRankIsHeardFromAndARankOfAnEndedJobIsToldToStop) {
  JobEntry& entry = RunningJob();
  const std::string id = entry.record.job.id();
  rooms_.now += absl::Seconds(5);
  auto connection = std::make_shared<RecordingConnection>();
  absl::StatusOr<WorkerKey> key = sessions_.Attach(HelloOf(id, "secret", 1, 1), connection);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->rank, 1);
  EXPECT_EQ(entry.active->ranks[1].last_heard, rooms_.now);
  EXPECT_TRUE(connection->stops.empty());
  ASSERT_TRUE(rooms_.table.Transition(entry, fitrun::v1::JOB_STATE_CANCELLED, "cancelled").ok());
  auto late = std::make_shared<RecordingConnection>();
  ASSERT_TRUE(sessions_.Attach(HelloOf(id, "secret", 1, 0), late).ok());
  EXPECT_EQ(late->stops, std::vector<std::string>{"the job has ended"});
}

TEST_F(WorkerSessionsTest, AnOutOfMemoryReportIsStoredBeforeItFailsTheAttemptOverToARestart) {
  JobEntry& entry = RunningJob();
  const std::string id = entry.record.job.id();
  fitrun::v1::WorkerReport oom;
  oom.mutable_oom()->set_rank(0);
  oom.mutable_oom()->set_step(3);
  oom.mutable_oom()->set_per_device_batch(64);
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(4);
  std::vector<const fitrun::v1::WorkerReport*> reports = {&oom, &progress};
  sessions_.TakeReports(WorkerKey{id, 1, 0}, reports);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RESTARTING);
  ASSERT_EQ(entry.record.job.oom_history_size(), 1);
  EXPECT_EQ(entry.record.job.oom_history(0).per_device_batch(), 64);
  // Its peer is stopped at once; the rank that ran out of memory exits on its own (killed only if it
  // outlives the grace).
  EXPECT_EQ(launcher_.stopped(), std::vector<int>{1});
  EXPECT_EQ(launcher_.left_to_exit(), std::vector<int>{0});
  // The OOM event went out before the state change it led to.
  bool oom_seen = false;
  const absl::StatusOr<std::vector<fitrun::v1::JobEvent>> stored = rooms_.store.ReadEvents(id, 1, 1000);
  ASSERT_TRUE(stored.ok());
  for (const fitrun::v1::JobEvent& event : *stored) {
    if (event.has_oom()) oom_seen = true;
    if (event.has_state_changed() && event.state_changed().to() == fitrun::v1::JOB_STATE_RESTARTING) {
      EXPECT_TRUE(oom_seen);
    }
  }
  EXPECT_TRUE(oom_seen);
}

}  // namespace
}  // namespace fitrun::server
