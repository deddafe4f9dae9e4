// Attempts on their own: no manager, no lock, no threads. Each test walks one attempt through the
// calls the manager makes, with a fake launcher whose ranks exit when the test says.
#include "server/core/jobs/attempts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "server/core/jobs/rooms_testing.h"

namespace fitrun::server {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A spec allowing `max_restarts` restarts, with ranks silent for `heartbeat_seconds` taken as hung.
fitrun::v1::JobSpec Tolerating(int max_restarts, int heartbeat_seconds = 0) {
  fitrun::v1::JobSpec spec;
  spec.mutable_fault_tolerance()->set_max_restarts(max_restarts);
  spec.mutable_fault_tolerance()->set_heartbeat_timeout_seconds(heartbeat_seconds);
  return spec;
}

class AttemptsTest : public ::testing::Test {
 protected:
  RoomsForTest rooms_;
  Attempts& attempts_ = rooms_.attempts;
  FakeWorkerLauncher& launcher_ = rooms_.launcher;
};

TEST_F(AttemptsTest, AReservationHoldsThePlansDevicesAndPutsTheAttemptOnRecordBeforeAnyRankStarts) {
  JobEntry& entry = rooms_.PlanningJob(Tolerating(1));
  PendingLaunch launch = attempts_.Reserve(entry, RoomsForTest::OnTwoDevices(entry, 8, kGiB / 2));
  EXPECT_EQ(launch.attempt, 1);
  ASSERT_TRUE(entry.active.has_value());
  EXPECT_TRUE(entry.active->launching);
  EXPECT_TRUE(rooms_.Held("cpu:0") && rooms_.Held("cpu:1")) << "the next placement sees them taken";
  ASSERT_EQ(entry.record.job.attempt_history_size(), 1);
  EXPECT_EQ(entry.record.job.attempt_history(0).predicted_peak_bytes(), kGiB / 2);
  // Until the commit it has no handle: a stop asks nothing of the launcher, and nothing is released.
  attempts_.StopRanks(entry, "cancelled");
  attempts_.MaybeRelease(entry);
  EXPECT_TRUE(launcher_.stopped().empty());
  EXPECT_TRUE(rooms_.Held("cpu:0"));
}

TEST_F(AttemptsTest, AFailedLaunchRollsBackFailingTheJobAndFreeingItsDevices) {
  JobEntry& entry = rooms_.PlanningJob(Tolerating(1));
  PendingLaunch launch = attempts_.Reserve(entry, RoomsForTest::OnTwoDevices(entry));
  rooms_.table.TakePassRequest();
  attempts_.Commit(launch, absl::InternalError("launching the ranks: no such binary"), /*stop_now=*/false);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_NE(entry.record.job.failure_reason().find("launch failed: launching the ranks: no such binary"),
            std::string::npos)
      << entry.record.job.failure_reason();
  EXPECT_EQ(entry.record.job.attempt_history(0).outcome(), entry.record.job.failure_reason());
  EXPECT_FALSE(entry.active.has_value());
  EXPECT_FALSE(rooms_.Held("cpu:0") || rooms_.Held("cpu:1"));
  EXPECT_TRUE(rooms_.table.TakePassRequest()) << "freed devices and an ended job are the scheduler's to see";
}

TEST_F(AttemptsTest, ACrashedRankStopsItsPeerAndTheJobRestartsOnceThePeerIsGone) {
  JobEntry& entry = rooms_.PlanningJob(Tolerating(/*max_restarts=*/1));
  rooms_.Run(RoomsForTest::OnTwoDevices(entry));
  ASSERT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING);
  launcher_.Exit(0, 1);  // rank 0 exits with code 1
  rooms_.DeliverExits(entry);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(launcher_.stopped(), std::vector<int>{1}) << "its peer would wait in its next collective";
  EXPECT_TRUE(rooms_.Held("cpu:1")) << "devices stay held while a rank of the attempt lives";
  launcher_.Exit(1, 0, /*signal=*/15);
  rooms_.DeliverExits(entry);
  EXPECT_FALSE(entry.active.has_value());
  EXPECT_FALSE(rooms_.Held("cpu:0") || rooms_.Held("cpu:1"));
  EXPECT_NE(entry.record.job.attempt_history(0).outcome().find("rank 0 exited with code 1 (attempt 1)"),
            std::string::npos)
      << entry.record.job.attempt_history(0).outcome();
  // The second crash is past max_restarts: the job fails, saying so.
  ASSERT_TRUE(rooms_.table.Transition(entry, fitrun::v1::JOB_STATE_PLANNING, "devices are free").ok());
  rooms_.Run(RoomsForTest::OnTwoDevices(entry));
  launcher_.Exit(3, 1);
  rooms_.DeliverExits(entry);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_NE(entry.record.job.failure_reason().find("rank 1 exited with code 1 (attempt 2)"), std::string::npos)
      << entry.record.job.failure_reason();
}

TEST_F(AttemptsTest, ASilentRankFailsItsAttemptOverAtItsHeartbeatDeadlineAndNotBefore) {
  JobEntry& entry = rooms_.PlanningJob(Tolerating(/*max_restarts=*/1, /*heartbeat_seconds=*/30));
  rooms_.Run(RoomsForTest::OnTwoDevices(entry));
  const absl::Time start = rooms_.now;
  entry.active->ranks[0].last_heard = start + absl::Seconds(10);  // rank 0 spoke later than rank 1
  EXPECT_EQ(attempts_.CheckHeartbeats(start + absl::Seconds(29)), start + absl::Seconds(30))
      << "the next check is due when rank 1's silence reaches the timeout";
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING);
  attempts_.CheckHeartbeats(start + absl::Seconds(30));
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_NE(entry.record.job.attempt_history(0).outcome().find("rank 1 sent nothing for 30.0 s"), std::string::npos)
      << entry.record.job.attempt_history(0).outcome();
  EXPECT_EQ(launcher_.stopped().size(), 2u);
}

TEST_F(AttemptsTest, RanksThatExitCleanBeforeTheirFinalReportsSucceedOnceTheWaitForThemIsOver) {
  JobEntry& entry = rooms_.PlanningJob(Tolerating(1));
  rooms_.Run(RoomsForTest::OnTwoDevices(entry));
  const absl::Time start = rooms_.now;
  launcher_.Exit(0, 0);
  launcher_.Exit(1, 0);
  rooms_.DeliverExits(entry);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING) << "reports may still be in flight";
  ASSERT_TRUE(entry.active.has_value());
  EXPECT_EQ(attempts_.EndReportWaits(start + absl::Seconds(1)), start + absl::Seconds(3));
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING);
  attempts_.EndReportWaits(start + absl::Seconds(3));
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(entry.record.job.attempt_history(0).outcome(), "succeeded");
  EXPECT_FALSE(rooms_.Held("cpu:0") || rooms_.Held("cpu:1"));
}

TEST_F(AttemptsTest, AJobCancelledWhileItsRanksStartHasThemStoppedAtTheCommit) {
  JobEntry& entry = rooms_.PlanningJob(Tolerating(1));
  PendingLaunch launch = attempts_.Reserve(entry, RoomsForTest::OnTwoDevices(entry));
  entry.record.job.set_failure_reason("cancelled by a user");
  ASSERT_TRUE(rooms_.table.Transition(entry, fitrun::v1::JOB_STATE_CANCELLED, "cancelled by a user").ok());
  rooms_.StartAndCommit(launch);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_CANCELLED);
  std::vector<int> stopped = launcher_.stopped();
  std::sort(stopped.begin(), stopped.end());
  EXPECT_EQ(stopped, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace fitrun::server
