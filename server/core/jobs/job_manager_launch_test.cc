// Launching an attempt with the manager's lock released: while one job's ranks are being started
// (a slow spawn, a stalled sbatch), every other call is served, and what happens to the job
// meanwhile (a cancel, a rank's exit) is taken once the launch is committed.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"
#include "server/core/specs/job_specs.h"
#include "server/testing/wait.h"

namespace fitrun::server {
namespace {

// Starts the ranks as the fake does, then holds the launch until Release(): a launcher whose
// spawn or sbatch takes as long as the test says.
class StalledLauncher : public FakeWorkerLauncher {
 public:
  absl::StatusOr<LaunchedAttempt> Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) override {
    absl::StatusOr<LaunchedAttempt> launched = FakeWorkerLauncher::Launch(attempt, std::move(on_exit));
    if (!held_.HasBeenNotified()) held_.Notify();
    release_.WaitForNotification();
    return launched;
  }
  bool WaitUntilHeld() { return held_.WaitForNotificationWithTimeout(absl::Seconds(5)); }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  absl::Notification held_;
  absl::Notification release_;
};

// Runs `call` on a thread of its own and says whether it returned within 5 s (a call waiting for
// the held launch never would).
template <typename Call>
bool ReturnsWhileHeld(Call call) {
  std::future<void> done = std::async(std::launch::async, std::move(call));
  return done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
}

class JobManagerLaunchTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(jobs_.Start(), absl::OkStatus()); }
  void TearDown() override {
    // Whatever a test left held is let go, so the scheduler thread can stop.
    launcher_.Release();
    jobs_.Stop();
  }

  // Submits a one-device job (never restarted) and waits until its launch is held.
  std::string SubmitHeld() {
    fitrun::v1::JobSpec spec = MlpSpec("held", 256, 10, 1, 1);
    spec.mutable_fault_tolerance()->set_max_restarts(0);
    absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(launcher_.WaitUntilHeld());
    return job.ok() ? job->id() : "";
  }

  StalledLauncher launcher_;
  TestJobManager jobs_{&launcher_};
};

TEST_F(JobManagerLaunchTest, ASubmitAndAWatcherAreServedWhileALaunchIsHeldUp) {
  const std::string held = SubmitHeld();
  std::string second;
  EXPECT_TRUE(ReturnsWhileHeld([&] {
    absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec("second", 256, 10, 1, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    second = job->id();
  })) << "a submit waited for another job's launch";
  EXPECT_TRUE(ReturnsWhileHeld([&] {
    // A watcher of the held job sees its plan chosen; the job waits in PLANNING, its device held.
    absl::StatusOr<std::vector<fitrun::v1::JobEvent>> events = jobs_.manager().ReadEvents(held, 1, 100);
    ASSERT_TRUE(events.ok()) << events.status();
    bool plan_chosen = false;
    for (const fitrun::v1::JobEvent& event : *events) plan_chosen |= event.has_plan_chosen();
    EXPECT_TRUE(plan_chosen);
    EXPECT_EQ(jobs_.manager().Get(held)->state(), fitrun::v1::JOB_STATE_PLANNING);
    int held_devices = 0;
    for (const fitrun::v1::Device& device : jobs_.manager().Devices()) held_devices += device.job_id() == held;
    EXPECT_EQ(held_devices, 1);
    EXPECT_FALSE(jobs_.manager().List({}).empty());
  })) << "a watcher waited for another job's launch";

  launcher_.Release();
  WaitForState(jobs_.manager(), held, fitrun::v1::JOB_STATE_RUNNING);
  // The second job had the other device: it launched after the held one, on its own.
  WaitForState(jobs_.manager(), second, fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_NE(jobs_.manager().Get(held)->plan().device_ids(0), jobs_.manager().Get(second)->plan().device_ids(0));
}

TEST_F(JobManagerLaunchTest, ACancelWhileTheRanksStartStopsThemOnceStarted) {
  const std::string held = SubmitHeld();
  absl::StatusOr<fitrun::v1::Job> cancelled;
  EXPECT_TRUE(ReturnsWhileHeld([&] { cancelled = jobs_.manager().Cancel(held, "not needed"); }));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), fitrun::v1::JOB_STATE_CANCELLED);
  // The attempt on record is the one whose ranks were starting.
  ASSERT_EQ(cancelled->attempt_history_size(), 1);
  EXPECT_EQ(cancelled->attempt_history(0).outcome(), "cancelled: not needed");
  EXPECT_TRUE(launcher_.stopped().empty()) << "nothing to stop before the launcher says what it started";

  launcher_.Release();
  ASSERT_TRUE(WaitUntil([&] { return launcher_.stopped().size() == 1; }));
  // Once its rank is gone the device is free again, and the attempt's record says where it ran.
  launcher_.Exit(0, -1, /*signal=*/15);
  ASSERT_TRUE(WaitUntil([&] {
    for (const fitrun::v1::Device& device : jobs_.manager().Devices()) {
      if (!device.job_id().empty()) return false;
    }
    return true;
  }));
  const fitrun::v1::Job job = *jobs_.manager().Get(held);
  EXPECT_EQ(job.state(), fitrun::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.attempt_history(0).launch_handle(), "fake:0");
  EXPECT_EQ(launcher_.released(), std::vector<std::string>{"fake:0"});
}

TEST_F(JobManagerLaunchTest, ARankExitingWhileItsLaunchIsHeldIsTakenAfterTheCommit) {
  const std::string held = SubmitHeld();
  // The rank dies at once, before the launcher returned: its exit waits for the launch's commit
  // (a failure of a RUNNING attempt), not dropped as one of an attempt not yet running.
  std::thread exit([&] { launcher_.Exit(0, 1); });
  EXPECT_EQ(jobs_.manager().Get(held)->state(), fitrun::v1::JOB_STATE_PLANNING);
  // Time for the exit to arrive first (the job must end FAILED whichever comes first).
  absl::SleepFor(absl::Milliseconds(200));
  launcher_.Release();
  exit.join();
  const fitrun::v1::Job job = WaitForState(jobs_.manager(), held, fitrun::v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.failure_reason(), "rank 0 exited with code 1")) << job.failure_reason();
  ASSERT_EQ(job.attempt_history_size(), 1);
  EXPECT_TRUE(job.attempt_history(0).ranks(0).exited());
  EXPECT_EQ(job.attempt_history(0).ranks(0).exit_code(), 1);
}

TEST_F(JobManagerLaunchTest, ALaunchThatFailsWhileUnlockedFailsTheJobAndFreesItsDevice) {
  launcher_.Release();
  launcher_.FailLaunches(absl::UnavailableError("sbatch: the controller did not answer"));
  absl::StatusOr<fitrun::v1::Job> submitted = jobs_.manager().Submit(MlpSpec("fails", 256, 10, 1, 1));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const fitrun::v1::Job job = WaitForState(jobs_.manager(), submitted->id(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.failure_reason(), "launch failed")) << job.failure_reason();
  EXPECT_TRUE(absl::StrContains(job.failure_reason(), "the controller did not answer")) << job.failure_reason();
  ASSERT_EQ(job.attempt_history_size(), 1);
  EXPECT_TRUE(absl::StrContains(job.attempt_history(0).outcome(), "launch failed"));
  for (const fitrun::v1::Device& device : jobs_.manager().Devices()) EXPECT_EQ(device.job_id(), "");
}

}  // namespace
}  // namespace fitrun::server
