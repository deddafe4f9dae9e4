#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_join.h"

#include "server/core/specs/job_specs.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;

TEST_F(JobManagerTest, SubmittedJobIsStoredBeforeSubmitReturns) {
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(jobs_.store().job_count(), 1u);
  EXPECT_EQ(job->state(), fitrun::v1::JOB_STATE_QUEUED);
}

TEST_F(JobManagerTest, ASubmitTheStoreRefusesIsNotAcknowledgedAndLeavesNoJob) {
  jobs_.store().FailPuts(absl::InternalError("disk full"));
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(Spec(1, 2));
  ASSERT_EQ(job.status().code(), absl::StatusCode::kUnavailable) << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr("could not store the job: disk full"));
  EXPECT_TRUE(jobs_.manager().List({}).empty());
  EXPECT_EQ(jobs_.metrics().jobs_in(fitrun::v1::JOB_STATE_QUEUED), 0);
  EXPECT_EQ(jobs_.store().job_count(), 0u);
  // Once the store takes it again, submitting works and nothing of the refused job shows.
  jobs_.store().FailPuts(absl::OkStatus());
  job = jobs_.manager().Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(jobs_.manager().List({}).size(), 1u);
}

TEST_F(JobManagerTest, EndedJobsBeyondTheRetentionAreForgottenWithTheirEvents) {
  jobs_.options().retain_finished_jobs = 2;
  ASSERT_EQ(jobs_.Restart(), absl::OkStatus());
  JobManager& manager = jobs_.manager();
  FakeJobStore& store = jobs_.store();
  // A job on both devices, open throughout: the others wait behind it until cancelled.
  absl::StatusOr<fitrun::v1::Job> open = manager.Submit(MlpSpec("open", 256, 10, 2, 2));
  ASSERT_TRUE(open.ok()) << open.status();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<fitrun::v1::Job> job = manager.Submit(MlpSpec("kept", 256, 10, 2, 2));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
    ASSERT_TRUE(manager.Cancel(job->id(), "done").ok());
  }
  manager.RunSchedulingPass();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (store.job_count() > 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(store.job_count(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(absl::IsNotFound(manager.Get(ids[i]).status())) << ids[i];
    EXPECT_EQ(store.event_count(ids[i]), 0u) << ids[i];
  }
  for (int i = 3; i < 5; ++i) EXPECT_TRUE(manager.Get(ids[i]).ok()) << ids[i];
  // The job still open is never forgotten, however many ended after it.
  EXPECT_TRUE(manager.Get(open->id()).ok());
  EXPECT_EQ(manager.List({}).size(), 3u) << "the open job and the two newest ended ones";
}

TEST_F(JobManagerTest, LaunchesOneWorkerPerDeviceWithTheTorchrunContract) {
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(Spec(1, 2), 2);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<WorkerLaunch> launches = jobs_.launcher().launches();
  ASSERT_EQ(launches.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, std::string> env = EnvOf(launches[rank]);
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "29500");
    EXPECT_EQ(env["FITRUN_JOB_ID"], job->id());
    EXPECT_EQ(env["FITRUN_ATTEMPT"], "1");
    // The token is the launcher's to hand over (launch_contract.h), never in the environment.
    EXPECT_EQ(env.count("FITRUN_JOB_TOKEN"), 0u);
    EXPECT_EQ(launches[rank].job_token.size(), 32u);
    EXPECT_TRUE(std::filesystem::exists(env["FITRUN_ASSIGNMENT"]));
    EXPECT_EQ(launches[rank].argv.at(0), "/bin/fitrun-worker");
  }
  // Every device is taken, by one rank each.
  for (const fitrun::v1::Device& device : jobs_.manager().Devices()) EXPECT_EQ(device.job_id(), job->id());
}

TEST_F(JobManagerTest, JobSucceedsWhenEveryRankFinishesAndFreesItsDevices) {
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(Spec(2, 2), 2);
  ASSERT_TRUE(job.ok()) << job.status();
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(5);
  progress.mutable_progress()->set_loss(1.25);
  progress.mutable_progress()->set_peak_bytes(7 << 20);
  Report(job->id(), 1, 0, progress);
  fitrun::v1::WorkerReport saved;
  saved.mutable_checkpoint_saved()->set_step(5);
  saved.mutable_checkpoint_saved()->set_seconds(0.25);
  Report(job->id(), 1, 0, saved);
  fitrun::v1::WorkerReport failed;
  failed.mutable_checkpoint_failed()->set_step(6);
  failed.mutable_checkpoint_failed()->set_error("read-only file system");
  Report(job->id(), 1, 0, failed);
  // While it runs, the monitoring views show rank 0's latest report and the devices' plan and peak.
  std::vector<JobManager::RunningJob> running = jobs_.manager().Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].job.id(), job->id());
  ASSERT_EQ(running[0].ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(running[0].ranks[0].last_progress.loss(), 1.25);
  EXPECT_EQ(running[0].ranks[0].peak_bytes, 7 << 20);
  EXPECT_EQ(running[0].ranks[1].last_progress.step(), 0);  // rank 1 has not reported
  EXPECT_GT(running[0].ranks[0].planned_bytes, 0);
  for (const fitrun::v1::Device& device : jobs_.manager().Devices()) {
    EXPECT_EQ(device.planned_bytes(), running[0].ranks[0].planned_bytes);
    EXPECT_EQ(device.peak_bytes(), device.id() == running[0].ranks[0].device_id ? (7 << 20) : 0);
    EXPECT_EQ(device.free_bytes(), device.total_bytes() - device.peak_bytes());
  }
  EXPECT_EQ(jobs_.metrics().checkpoint_times(), std::vector<absl::Duration>{absl::Milliseconds(250)});
  EXPECT_EQ(jobs_.metrics().checkpoint_failures(), 1);
  ReportFinished(job->id(), 0, 0.83);
  ReportFinished(job->id(), 1, 0);
  jobs_.launcher().Exit(0, 0);
  jobs_.launcher().Exit(1, 0);
  fitrun::v1::Job done = WaitForState(job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_DOUBLE_EQ(done.result().test_accuracy(), 0.83);
  // Rank 0's own figures are the job's.
  ASSERT_EQ(done.result().metrics().count("hr@10"), 1u);
  EXPECT_DOUBLE_EQ(done.result().metrics().at("hr@10"), 0.83);
  EXPECT_EQ(done.result().steps(), 10);
  EXPECT_EQ(done.last_progress().step(), 5);
  for (const fitrun::v1::Device& device : jobs_.manager().Devices()) EXPECT_EQ(device.job_id(), "");
  EXPECT_EQ(jobs_.metrics().jobs_in(fitrun::v1::JOB_STATE_SUCCEEDED), 1);
  EXPECT_EQ(jobs_.metrics().steps(), 5);
  EXPECT_TRUE(jobs_.manager().Running().empty());
  // Its end is in the queue-wait and duration histograms once, under its final state.
  ASSERT_EQ(jobs_.metrics().ended().size(), 1u);
  EXPECT_EQ(jobs_.metrics().ended()[0].state, fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_GE(jobs_.metrics().ended()[0].duration, jobs_.metrics().ended()[0].queue_wait);
  ASSERT_TRUE(jobs_.manager().Ranks(job->id()).ok());
  EXPECT_EQ(jobs_.manager().Ranks(job->id())->size(), 2u);
}

// The host's memory bounds what running jobs' ranks are promised together: a CPU device's rank
// takes its device's 4 GiB plus 2 GiB for its process by default, so a 14 GiB host holds two ranks.
TEST(JobManagerHostMemoryTest, PlansTakeFewerDevicesOrWaitSoTheHostIsNeverPromisedMoreThanItHas) {
  TestJobManager jobs;
  jobs.set_devices(FakeDeviceInventory(4, 4LL << 30));
  jobs.options().host_memory_bytes = 14LL << 30;
  ASSERT_EQ(jobs.Start(), absl::OkStatus());
  JobManager& manager = jobs.manager();
  FakeWorkerLauncher& launcher = jobs.launcher();
  // Up to four devices allowed; the host holds two ranks.
  absl::StatusOr<fitrun::v1::Job> first = manager.Submit(Spec(1, 4));
  ASSERT_TRUE(first.ok()) << first.status();
  const fitrun::v1::Job running = WaitForState(manager, first->id(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(running.plan().device_ids_size(), 2);
  EXPECT_EQ(running.plan().host_memory_bytes(), 12LL << 30);
  EXPECT_THAT(absl::StrJoin(running.plan().reasons(), "\n"), HasSubstr("host memory"));
  // Two devices are free, but not the host memory their ranks would need: the next job waits.
  absl::StatusOr<fitrun::v1::Job> second = manager.Submit(Spec(1, 1));
  ASSERT_TRUE(second.ok()) << second.status();
  manager.RunSchedulingPass();
  EXPECT_EQ(manager.Get(second->id())->state(), fitrun::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(launcher.launches().size(), 2u);
  // The first ends: the second runs.
  launcher.Exit(0, 3);
  launcher.Exit(1, 3);
  WaitForState(manager, first->id(), fitrun::v1::JOB_STATE_RESTARTING);
  // Cancelled, so it does not take the host again before the second.
  ASSERT_TRUE(manager.Cancel(first->id(), "test").ok());
  WaitForState(manager, second->id(), fitrun::v1::JOB_STATE_RUNNING);
  // A job whose one rank could never fit on this host is refused at submit, naming the flag.
  fitrun::v1::JobSpec huge = Spec(1, 1);
  huge.mutable_resources()->set_host_memory("20GiB");
  absl::Status refused = manager.Submit(huge).status();
  EXPECT_THAT(refused.message(), HasSubstr("--host_memory")) << refused;
}

TEST_F(JobManagerTest, ExitWithoutFinalReportStillSucceedsAfterTheWait) {
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(Spec(1, 1));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(1, absl::Seconds(5)));
  jobs_.launcher().Exit(0, 0);
  fitrun::v1::Job done = WaitForState(job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobManagerTest, FailingRankFailsTheJobAndStopsItsPeersAtOnce) {
  fitrun::v1::JobSpec spec = Spec(2, 2);
  spec.mutable_fault_tolerance()->set_max_restarts(0);
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(spec, 2);
  ASSERT_TRUE(job.ok()) << job.status();
  {
    std::ofstream log(jobs_.launcher().launches()[1].log_path);
    log << "step 3\nRuntimeError: something broke\n";
  }
  jobs_.launcher().Exit(1, 7);
  fitrun::v1::Job failed = WaitForState(job->id(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("rank 1 exited with code 7"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("RuntimeError: something broke"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("giving up after 0 restart(s)"));
  EXPECT_EQ(jobs_.launcher().stopped(), std::vector<int>{0});
  // Devices stay taken until the stopped peer has really exited.
  EXPECT_EQ(jobs_.manager().Devices()[0].job_id(), job->id());
  jobs_.launcher().Exit(0, -1, 15);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!jobs_.manager().Devices()[0].job_id().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(jobs_.manager().Devices()[0].job_id(), "");
}

TEST_F(JobManagerTest, BadSpecIsRejectedAndNothingIsStoredOrLaunched) {
  fitrun::v1::JobSpec spec = Spec(1, 2);
  spec.set_global_batch_size(-1);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("spec.global_batch_size"));
  EXPECT_EQ(jobs_.store().job_count(), 0u);
  EXPECT_TRUE(jobs_.launcher().launches().empty());
}

TEST_F(JobManagerTest, MoreDevicesThanTheNodeHasIsRejectedAtSubmit) {
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(Spec(4, 4));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("spec.resources.min_devices"));
  EXPECT_EQ(jobs_.store().job_count(), 0u);
}

TEST_F(JobManagerTest, CancelStopsRanksAndEndsCancelled) {
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(Spec(2, 2), 2);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<fitrun::v1::Job> cancelled = jobs_.manager().Cancel(job->id(), "");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), fitrun::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs_.launcher().stopped().size(), 2u);
  EXPECT_EQ(jobs_.manager().Cancel(job->id(), "").status().code(), absl::StatusCode::kFailedPrecondition);
  // The attempt is released once, when its last rank is gone: whatever they left is the launcher's
  // to kill.
  EXPECT_TRUE(jobs_.launcher().released().empty());
  jobs_.launcher().Exit(0, -1, 15);
  EXPECT_TRUE(jobs_.launcher().released().empty());
  jobs_.launcher().Exit(1, -1, 15);
  EXPECT_EQ(jobs_.launcher().released(), std::vector<std::string>{"fake:0"});
}

TEST_F(JobManagerTest, QueuedJobWaitsForDevicesAndRunsInPriorityOrder) {
  absl::StatusOr<fitrun::v1::Job> first = jobs_.manager().Submit(Spec(2, 2));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  absl::StatusOr<fitrun::v1::Job> low = jobs_.manager().Submit(Spec(2, 2, /*priority=*/0));
  absl::StatusOr<fitrun::v1::Job> high = jobs_.manager().Submit(Spec(2, 2, /*priority=*/5));
  ASSERT_TRUE(low.ok() && high.ok());
  EXPECT_EQ(jobs_.manager().Get(low->id())->state(), fitrun::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(jobs_.manager().Get(high->id())->state(), fitrun::v1::JOB_STATE_QUEUED);

  ASSERT_TRUE(jobs_.manager().Cancel(first->id(), "").ok());
  jobs_.launcher().Exit(0, -1, 15);
  jobs_.launcher().Exit(1, -1, 15);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(4, absl::Seconds(5)));
  EXPECT_EQ(jobs_.launcher().launches()[2].job_id, high->id());
  EXPECT_EQ(jobs_.manager().Get(low->id())->state(), fitrun::v1::JOB_STATE_QUEUED);
}

// The scheduling policy against starvation: the queue's head waits for its devices and nothing
// behind it is started on the devices it is waiting for (no backfill).
TEST_F(JobManagerTest, LargeJobIsNotStarvedBySmallJobsBehindIt) {
  absl::StatusOr<fitrun::v1::Job> small_running = jobs_.manager().Submit(Spec(1, 1));
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(1, absl::Seconds(5)));
  absl::StatusOr<fitrun::v1::Job> large = jobs_.manager().Submit(Spec(2, 2));
  std::vector<std::string> smalls;
  for (int i = 0; i < 3; ++i) smalls.push_back(jobs_.manager().Submit(Spec(1, 1))->id());
  // cpu:1 is free, but the large job is first in line for it: a whole scheduling pass over the queue
  // starts nothing.
  jobs_.manager().RunSchedulingPass();
  EXPECT_EQ(jobs_.launcher().launches().size(), 1u);
  EXPECT_EQ(jobs_.manager().Get(large->id())->state(), fitrun::v1::JOB_STATE_QUEUED);
  for (const std::string& id : smalls) EXPECT_EQ(jobs_.manager().Get(id)->state(), fitrun::v1::JOB_STATE_QUEUED);

  ASSERT_TRUE(jobs_.manager().Cancel(small_running->id(), "").ok());
  jobs_.launcher().Exit(0, -1, 15);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(3, absl::Seconds(5)));
  EXPECT_EQ(jobs_.launcher().launches()[1].job_id, large->id());
  EXPECT_EQ(jobs_.launcher().launches()[2].job_id, large->id());
}

TEST_F(JobManagerTest, AWrongTokenAndAMissingJobGetTheSameAnswer) {
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(Spec(1, 1), 1);
  ASSERT_TRUE(job.ok()) << job.status();
  fitrun::v1::Hello hello;
  hello.set_job_id(job->id());
  hello.set_attempt(1);
  hello.set_rank(0);
  const std::string token = jobs_.launcher().launches()[0].job_token;
  hello.set_job_token(token.substr(0, 31) + "x");
  const absl::Status wrong_token = jobs_.manager().AttachWorker(hello, {}).status();
  hello.set_job_id("j-999999");
  hello.set_job_token(token);
  const absl::Status no_job = jobs_.manager().AttachWorker(hello, {}).status();
  EXPECT_EQ(wrong_token.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(wrong_token, no_job) << "nothing tells an existing job from a missing one";
  hello.set_job_id(job->id());
  hello.set_job_token("");
  EXPECT_EQ(jobs_.manager().AttachWorker(hello, {}).status(), no_job);
  hello.set_job_token(token);
  EXPECT_TRUE(jobs_.manager().AttachWorker(hello, {}).ok());
}

TEST_F(JobManagerTest, EventsAreDenseAndReplayableFromAnySequence) {
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(Spec(1, 1));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(1, absl::Seconds(5)));
  ReportFinished(job->id(), 0, 0.9);
  jobs_.launcher().Exit(0, 0);
  fitrun::v1::Job done = WaitForState(job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> all = jobs_.manager().ReadEvents(job->id(), 1, 1000);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(static_cast<int64_t>(all->size()), done.last_sequence());
  for (size_t i = 0; i < all->size(); ++i) EXPECT_EQ((*all)[i].sequence(), static_cast<int64_t>(i + 1));
  // QUEUED, PLANNING, plan, RUNNING, finished, exited, SUCCEEDED
  EXPECT_TRUE(all->front().has_state_changed());
  EXPECT_EQ(all->back().state_changed().to(), fitrun::v1::JOB_STATE_SUCCEEDED);
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> suffix = jobs_.manager().ReadEvents(job->id(), 3, 1000);
  ASSERT_TRUE(suffix.ok());
  EXPECT_EQ(suffix->front().sequence(), 3);
}

// A coordinator restart is a new manager over the same store.
class JobManagerRecoveryTest : public JobManagerTest {
 protected:
  void Restart() { ASSERT_EQ(jobs_.Restart(), absl::OkStatus()); }
};

TEST_F(JobManagerRecoveryTest, QueuedJobsStayQueuedAcrossARestart) {
  absl::StatusOr<fitrun::v1::Job> running = jobs_.manager().Submit(Spec(2, 2));
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  absl::StatusOr<fitrun::v1::Job> queued = jobs_.manager().Submit(Spec(2, 2));
  ASSERT_TRUE(queued.ok());
  jobs_.launcher().SetAdoptable({0, 1});
  Restart();
  EXPECT_EQ(jobs_.manager().Get(queued->id())->state(), fitrun::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(jobs_.manager().Get(running->id())->state(), fitrun::v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerRecoveryTest, ARequestIdGivesTheSameJobBackEvenAfterARestart) {
  absl::StatusOr<fitrun::v1::Job> first = jobs_.manager().Submit(Spec(2, 2), "alice", "req-1");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(jobs_.manager().Submit(Spec(2, 2), "alice", "req-1")->id(), first->id());
  // The id is the user's: another user's identical id is another job.
  EXPECT_NE(jobs_.manager().Submit(Spec(2, 2), "bob", "req-1")->id(), first->id());
  jobs_.launcher().SetAdoptable({0, 1});
  Restart();
  EXPECT_EQ(jobs_.manager().Submit(Spec(2, 2), "alice", "req-1")->id(), first->id());
  fitrun::v1::JobSpec different = Spec(2, 2);
  different.set_max_steps(11);
  EXPECT_THAT(jobs_.manager().Submit(different, "alice", "req-1").status().message(),
              ::testing::HasSubstr("request_id: 'req-1' already created job " + first->id() + " with a different spec"));
  EXPECT_EQ(jobs_.manager().List({}).size(), 2u);
}

TEST_F(JobManagerTest, PagesListEveryVisibleJobOnceInSubmissionOrder) {
  std::vector<std::string> alices;
  for (int i = 0; i < 25; ++i) {
    alices.push_back(jobs_.manager().Submit(Spec(1, 1), "alice")->id());
    (void)jobs_.manager().Submit(Spec(1, 1), "bob");
  }
  std::vector<std::string> seen;
  int64_t after = 0;
  int pages = 0;
  do {
    JobManager::Page page =
        jobs_.manager().ListPage({}, after, 10, [](const fitrun::v1::Job& job) { return job.owner() == "alice"; });
    for (const fitrun::v1::Job& job : page.jobs) seen.push_back(job.id());
    after = page.next_order;
    ++pages;
  } while (after != 0);
  EXPECT_EQ(seen, alices);
  EXPECT_EQ(pages, 3);
}

TEST_F(JobManagerTest, AnOwnersOpenJobsAreBoundedAndEndedOnesMakeRoom) {
  jobs_.options().max_open_jobs_per_owner = 2;
  ASSERT_EQ(jobs_.Restart(), absl::OkStatus());
  const std::string first = jobs_.manager().Submit(Spec(2, 2), "alice")->id();
  ASSERT_TRUE(jobs_.manager().Submit(Spec(2, 2), "alice").ok());
  absl::Status over = jobs_.manager().Submit(Spec(2, 2), "alice").status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), ::testing::HasSubstr("alice has 2 jobs queued or running, the limit"));
  EXPECT_TRUE(jobs_.manager().Submit(Spec(2, 2), "bob").ok());  // per owner
  ASSERT_TRUE(jobs_.manager().Cancel(first, "make room").ok());
  WaitForState(first, fitrun::v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(jobs_.manager().Submit(Spec(2, 2), "alice").ok());
}

TEST_F(JobManagerRecoveryTest, LiveWorkersAreReadoptedAndTheJobCompletes) {
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(Spec(2, 2), 2);
  ASSERT_TRUE(job.ok()) << job.status();
  // Rank 1's progress is stored as events but does not rewrite the job row: numbering after the
  // restart must still continue after it.
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(3);
  Report(job->id(), 1, 1, progress);
  Report(job->id(), 1, 1, progress);
  const int64_t last_before = jobs_.manager().Get(job->id())->last_sequence();
  const std::string token = jobs_.launcher().launches()[0].job_token;

  jobs_.launcher().SetAdoptable({0, 1});
  Restart();
  EXPECT_EQ(jobs_.launcher().adopted(), (std::vector<int>{0, 1}));
  EXPECT_EQ(jobs_.manager().Get(job->id())->state(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_.manager().Get(job->id())->attempts(), 1);
  for (const fitrun::v1::Device& device : jobs_.manager().Devices()) EXPECT_EQ(device.job_id(), job->id());

  // The workers reconnect with the job's token and finish; adopted exits carry no status.
  fitrun::v1::Hello hello;
  hello.set_job_id(job->id());
  hello.set_attempt(1);
  hello.set_rank(1);
  hello.set_job_token(token);
  EXPECT_TRUE(jobs_.manager().AttachWorker(hello, {}).ok());
  ReportFinished(job->id(), 0, 0.8);
  ReportFinished(job->id(), 1, 0);
  jobs_.launcher().Exit(2, 0, 0, /*status_known=*/false);
  jobs_.launcher().Exit(3, 0, 0, /*status_known=*/false);
  fitrun::v1::Job done = WaitForState(job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);

  // Numbering continued where it stopped: no gap, no duplicate.
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> events = jobs_.manager().ReadEvents(job->id(), 1, 1000);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(static_cast<int64_t>(events->size()), done.last_sequence());
  EXPECT_GT(done.last_sequence(), last_before);
  for (size_t i = 0; i < events->size(); ++i) EXPECT_EQ((*events)[i].sequence(), static_cast<int64_t>(i + 1));
}

TEST_F(JobManagerRecoveryTest, JobWhoseWorkersAreGoneRestartsAsANewAttempt) {
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(Spec(2, 2), 2);
  ASSERT_TRUE(job.ok()) << job.status();

  jobs_.launcher().SetAdoptable({0});  // rank 1 died with the coordinator
  Restart();
  // The survivor is stopped; once it is gone the job relaunches on both devices as attempt 2.
  EXPECT_EQ(jobs_.launcher().stopped(), std::vector<int>{2});  // not 0 or 1: a restart leaves ranks running
  EXPECT_EQ(jobs_.manager().Get(job->id())->state(), fitrun::v1::JOB_STATE_RESTARTING);
  jobs_.launcher().Exit(2, 0, 0, /*status_known=*/false);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(5, absl::Seconds(5)));
  fitrun::v1::Job relaunched = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(relaunched.attempts(), 2);
  ASSERT_EQ(relaunched.attempt_history_size(), 2);
  EXPECT_THAT(relaunched.attempt_history(0).outcome(), HasSubstr("1 of 2 ranks were gone"));
  EXPECT_EQ(EnvOf(jobs_.launcher().launches()[3])["FITRUN_ATTEMPT"], "2");
  // The same checkpoint directory, so the new attempt resumes where the last checkpoint left off.
  EXPECT_EQ(EnvOf(jobs_.launcher().launches()[3])["FITRUN_JOB_ID"], job->id());
}

TEST_F(JobManagerTest, AttemptHistoryRecordsEveryRanksExit) {
  fitrun::v1::JobSpec spec = Spec(2, 2);
  spec.mutable_fault_tolerance()->set_max_restarts(0);
  absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(spec, 2);
  ASSERT_TRUE(job.ok()) << job.status();
  jobs_.launcher().Exit(0, -1, 9);
  jobs_.launcher().Exit(1, -1, 15);
  fitrun::v1::Job failed = WaitForState(job->id(), fitrun::v1::JOB_STATE_FAILED);
  ASSERT_EQ(failed.attempt_history_size(), 1);
  const fitrun::v1::AttemptRecord& record = failed.attempt_history(0);
  EXPECT_EQ(record.outcome(), "rank 0 was killed by signal 9 (attempt 1)");
  ASSERT_EQ(record.ranks_size(), 2);
  EXPECT_EQ(record.ranks(0).signal(), 9);
  EXPECT_EQ(record.ranks(1).signal(), 15);
  EXPECT_TRUE(record.has_ended_at());
}

TEST_F(JobManagerTest, RelativeStateDirBecomesAbsoluteForWorkers) {
  jobs_.options().state_dir = "relative-state";
  ASSERT_EQ(jobs_.Restart(), absl::OkStatus());
  JobManager& manager = jobs_.manager();
  FakeWorkerLauncher& launcher = jobs_.launcher();
  ASSERT_TRUE(manager.Submit(Spec(1, 1)).ok());
  ASSERT_TRUE(launcher.WaitForLaunches(1, absl::Seconds(5)));
  const WorkerLaunch launch = launcher.launches()[0];
  EXPECT_TRUE(std::filesystem::path(launch.log_path).is_absolute());
  EXPECT_TRUE(std::filesystem::path(launch.working_dir).is_absolute());
  EXPECT_TRUE(std::filesystem::path(EnvOf(launch)["FITRUN_ASSIGNMENT"]).is_absolute());
  manager.Shutdown();
  std::filesystem::remove_all("relative-state");
}

}  // namespace
}  // namespace fitrun::server
