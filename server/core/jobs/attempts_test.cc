// Attempts on their own: no manager, no lock, no threads. Each test walks one attempt through the
// calls the manager makes, with a fake launcher whose ranks exit when the test says.
#include "server/core/jobs/attempts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/core/testing/recording_metrics.h"

namespace fitrun::server {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class AttemptsTest : public ::testing::Test {
 protected:
  AttemptsTest()
      : attempts_(Attempts::Options{"/jobs", absl::Seconds(2), absl::Seconds(3), 0, [this] { return now_; },
                                    [this](const fitrun::v1::Job& job, int attempt) {
                                      return [this, id = job.id(), attempt](int rank, const WorkerExit& exit) {
                                        exits_.push_back({WorkerKey{id, attempt, rank}, exit});
                                      };
                                    },
                                    [](const std::string&, int) { return AllocationCallback(); }},
                  &table_, &holders_, &launcher_, &metrics_, &run_memory_, &gate_) {}

  // A job admitted and in PLANNING, with `max_restarts` and `heartbeat_seconds` in its spec.
  JobEntry& PlanningJob(int max_restarts = 1, int heartbeat_seconds = 0) {
    JobEntry fresh;
    fitrun::v1::JobSpec& spec = *fresh.record.job.mutable_spec();
    spec.mutable_fault_tolerance()->set_max_restarts(max_restarts);
    spec.mutable_fault_tolerance()->set_heartbeat_timeout_seconds(heartbeat_seconds);
    JobEntry& entry = **table_.Admit(std::move(fresh), "submitted");
    EXPECT_TRUE(table_.Transition(entry, fitrun::v1::JOB_STATE_PLANNING, "devices are free").ok());
    return entry;
  }
  // Its plan's two ranks on cpu:0 and cpu:1.
  static Placement TwoRanks(JobEntry& entry) {
    fitrun::v1::Plan plan;
    plan.add_device_ids("cpu:0");
    plan.add_device_ids("cpu:1");
    plan.set_per_device_batch(8);
    plan.mutable_predicted()->set_total_bytes(kGiB / 2);
    return Placement{&entry, plan, "", false, absl::Milliseconds(1)};
  }
  // Reserves and launches the entry's next attempt through the fake launcher, then commits it.
  PendingLaunch LaunchAndCommit(JobEntry& entry) {
    PendingLaunch launch = attempts_.Reserve(entry, TwoRanks(entry));
    AttemptLaunch assembled;
    assembled.job_id = launch.job_id;
    assembled.attempt = launch.attempt;
    assembled.ranks.resize(2);
    attempts_.Commit(launch, launcher_.Launch(assembled, launch.on_exit), /*stop_now=*/false);
    return launch;
  }
  // The launcher's rank exits as the manager would hand them on.
  void DeliverExits(JobEntry& entry) {
    for (const auto& [key, exit] : std::exchange(exits_, {})) attempts_.OnRankExit(entry, key, exit, "");
  }
  bool Held(const std::string& device) {
    for (const fitrun::v1::Device& held : holders_.Devices(table_)) {
      if (held.id() == device) return !held.job_id().empty();
    }
    return false;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  FakeJobStore store_;
  EventHub hub_;
  RecordingMetrics metrics_;
  JobTable table_{JobTable::Options{0, 0, [this] { return now_; }}, &store_, &hub_, &metrics_};
  FakeDeviceInventory inventory_{2, 2 * kGiB};
  DeviceHolders holders_{&inventory_};
  const JobPlanner planner_{JobPlanner::Options{}};
  RunMemory run_memory_{&planner_, &table_, &inventory_, &metrics_, nullptr, nullptr};
  PlanningGate gate_{nullptr, [] {}};
  FakeWorkerLauncher launcher_;
  std::vector<std::pair<WorkerKey, WorkerExit>> exits_;
  Attempts attempts_;
};

TEST_F(AttemptsTest, AReservationHoldsThePlansDevicesAndPutsTheAttemptOnRecordBeforeAnyRankStarts) {
  JobEntry& entry = PlanningJob();
  PendingLaunch launch = attempts_.Reserve(entry, TwoRanks(entry));
  EXPECT_EQ(launch.attempt, 1);
  ASSERT_TRUE(entry.active.has_value());
  EXPECT_TRUE(entry.active->launching);
  EXPECT_TRUE(Held("cpu:0") && Held("cpu:1")) << "the next placement sees them taken";
  ASSERT_EQ(entry.record.job.attempt_history_size(), 1);
  EXPECT_EQ(entry.record.job.attempt_history(0).predicted_peak_bytes(), kGiB / 2);
  // Until the commit it has no handle: a stop asks nothing of the launcher, and nothing is released.
  attempts_.StopRanks(entry, "cancelled");
  attempts_.MaybeRelease(entry);
  EXPECT_TRUE(launcher_.stopped().empty());
  EXPECT_TRUE(Held("cpu:0"));
}

TEST_F(AttemptsTest, AFailedLaunchRollsBackFailingTheJobAndFreeingItsDevices) {
  JobEntry& entry = PlanningJob();
  PendingLaunch launch = attempts_.Reserve(entry, TwoRanks(entry));
  table_.TakePassRequest();
  attempts_.Commit(launch, absl::InternalError("launching the ranks: no such binary"), /*stop_now=*/false);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_NE(entry.record.job.failure_reason().find("launch failed: launching the ranks: no such binary"),
            std::string::npos)
      << entry.record.job.failure_reason();
  EXPECT_EQ(entry.record.job.attempt_history(0).outcome(), entry.record.job.failure_reason());
  EXPECT_FALSE(entry.active.has_value());
  EXPECT_FALSE(Held("cpu:0") || Held("cpu:1"));
  EXPECT_TRUE(table_.TakePassRequest()) << "freed devices and an ended job are the scheduler's to see";
}

TEST_F(AttemptsTest, ACrashedRankStopsItsPeerAndTheJobRestartsOnceThePeerIsGone) {
  JobEntry& entry = PlanningJob(/*max_restarts=*/1);
  LaunchAndCommit(entry);
  ASSERT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING);
  launcher_.Exit(0, 1);  // rank 0 exits with code 1
  DeliverExits(entry);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(launcher_.stopped(), std::vector<int>{1}) << "its peer would wait in its next collective";
  EXPECT_TRUE(Held("cpu:1")) << "devices stay held while a rank of the attempt lives";
  launcher_.Exit(1, 0, /*signal=*/15);
  DeliverExits(entry);
  EXPECT_FALSE(entry.active.has_value());
  EXPECT_FALSE(Held("cpu:0") || Held("cpu:1"));
  EXPECT_NE(entry.record.job.attempt_history(0).outcome().find("rank 0 exited with code 1 (attempt 1)"),
            std::string::npos)
      << entry.record.job.attempt_history(0).outcome();
  // The second crash is past max_restarts: the job fails, saying so.
  ASSERT_TRUE(table_.Transition(entry, fitrun::v1::JOB_STATE_PLANNING, "devices are free").ok());
  LaunchAndCommit(entry);
  launcher_.Exit(3, 1);
  DeliverExits(entry);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_NE(entry.record.job.failure_reason().find("rank 1 exited with code 1 (attempt 2)"), std::string::npos)
      << entry.record.job.failure_reason();
}

TEST_F(AttemptsTest, ASilentRankFailsItsAttemptOverAtItsHeartbeatDeadlineAndNotBefore) {
  JobEntry& entry = PlanningJob(/*max_restarts=*/1, /*heartbeat_seconds=*/30);
  LaunchAndCommit(entry);
  entry.active->ranks[0].last_heard = now_ + absl::Seconds(10);  // rank 0 spoke later than rank 1
  EXPECT_EQ(attempts_.CheckHeartbeats(now_ + absl::Seconds(29)), now_ + absl::Seconds(30))
      << "the next check is due when rank 1's silence reaches the timeout";
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING);
  attempts_.CheckHeartbeats(now_ + absl::Seconds(30));
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_NE(entry.record.job.attempt_history(0).outcome().find("rank 1 sent nothing for 30.0 s"), std::string::npos)
      << entry.record.job.attempt_history(0).outcome();
  EXPECT_EQ(launcher_.stopped().size(), 2u);
}

TEST_F(AttemptsTest, RanksThatExitCleanBeforeTheirFinalReportsSucceedOnceTheWaitForThemIsOver) {
  JobEntry& entry = PlanningJob();
  LaunchAndCommit(entry);
  launcher_.Exit(0, 0);
  launcher_.Exit(1, 0);
  DeliverExits(entry);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING) << "reports may still be in flight";
  ASSERT_TRUE(entry.active.has_value());
  EXPECT_EQ(attempts_.EndReportWaits(now_ + absl::Seconds(1)), now_ + absl::Seconds(3));
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_RUNNING);
  attempts_.EndReportWaits(now_ + absl::Seconds(3));
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(entry.record.job.attempt_history(0).outcome(), "succeeded");
  EXPECT_FALSE(Held("cpu:0") || Held("cpu:1"));
}

TEST_F(AttemptsTest, AJobCancelledWhileItsRanksStartHasThemStoppedAtTheCommit) {
  JobEntry& entry = PlanningJob();
  PendingLaunch launch = attempts_.Reserve(entry, TwoRanks(entry));
  entry.record.job.set_failure_reason("cancelled by a user");
  ASSERT_TRUE(table_.Transition(entry, fitrun::v1::JOB_STATE_CANCELLED, "cancelled by a user").ok());
  AttemptLaunch assembled;
  assembled.job_id = launch.job_id;
  assembled.attempt = launch.attempt;
  assembled.ranks.resize(2);
  attempts_.Commit(launch, launcher_.Launch(assembled, launch.on_exit), /*stop_now=*/false);
  EXPECT_EQ(entry.record.job.state(), fitrun::v1::JOB_STATE_CANCELLED);
  std::vector<int> stopped = launcher_.stopped();
  std::sort(stopped.begin(), stopped.end());
  EXPECT_EQ(stopped, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace fitrun::server
