// The manager's failure handling end to end over fakes: crashes restart the whole group as a new
// attempt, out-of-memory errors (the GPU's and the host's) re-plan a smaller batch with the same
// global batch, and every retry stops at its spec's limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <google/protobuf/text_format.h>
#include "absl/strings/match.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------------
// Recovery: crashes, hangs and out-of-memory errors

// Reads the plan the coordinator wrote for a launched rank.
fitrun::v1::Plan AssignedPlan(const WorkerLaunch& launch) {
  std::map<std::string, std::string> env(launch.env.begin(), launch.env.end());
  std::ifstream in(env["FITRUN_ASSIGNMENT"]);
  std::stringstream text;
  text << in.rdbuf();
  fitrun::v1::WorkerAssignment assignment;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text.str(), &assignment));
  return assignment.plan();
}

TEST_F(JobManagerTest, CrashedRankRestartsTheWholeGroupAsANewAttempt) {
  const std::string id = SubmitAndWaitRunning(Spec(2, 2), 2);
  jobs_.launcher().Exit(1, -1, 9);
  fitrun::v1::Job restarting = WaitForState(id, fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(jobs_.launcher().stopped(), std::vector<int>{0});  // the peer at once, not after a collective timeout
  EXPECT_EQ(restarting.restarts(), 1);
  // Nothing relaunches while the old rank 0 still runs: never two attempts at once.
  EXPECT_EQ(jobs_.launcher().launches().size(), 2u);
  jobs_.launcher().Exit(0, -1, 15);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(4, absl::Seconds(5)));
  fitrun::v1::Job relaunched = WaitForState(id, fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(relaunched.attempts(), 2);
  ASSERT_EQ(relaunched.attempt_history_size(), 2);
  EXPECT_EQ(relaunched.attempt_history(0).outcome(), "rank 1 was killed by signal 9 (attempt 1)");
  EXPECT_EQ(relaunched.attempt_history(0).ranks(1).signal(), 9);
  EXPECT_EQ(EnvOf(jobs_.launcher().launches()[2])["FITRUN_ATTEMPT"], "2");
  EXPECT_EQ(jobs_.metrics().restarts("crash"), 1);

  // Training resumes: the time to recover is measured and said.
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(3);
  Report(id, 2, 0, progress);
  EXPECT_EQ(jobs_.metrics().recoveries().size(), 1u);
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> events = jobs_.manager().ReadEvents(id, 1, 1000);
  ASSERT_TRUE(events.ok());
  bool said = false;
  for (const auto& event : *events) said |= event.has_log() && absl::StrContains(event.log().text(), "training resumed");
  EXPECT_TRUE(said);
}

TEST_F(JobManagerTest, RestartsStopAtTheSpecLimit) {
  fitrun::v1::JobSpec spec = Spec(1, 1);
  spec.mutable_fault_tolerance()->set_max_restarts(1);
  const std::string id = SubmitAndWaitRunning(spec, 1);
  jobs_.launcher().Exit(0, 1);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  WaitForState(id, fitrun::v1::JOB_STATE_RUNNING);
  jobs_.launcher().Exit(1, 1);
  fitrun::v1::Job failed = WaitForState(id, fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("rank 0 exited with code 1 (attempt 2)"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("giving up after 1 restart(s) (spec.fault_tolerance.max_restarts 1)"));
  EXPECT_EQ(failed.attempt_history_size(), 2);
}

TEST_F(JobManagerTest, RefusedConfigurationFailsWithoutARestart) {
  const std::string id = SubmitAndWaitRunning(Spec(1, 1), 1);
  jobs_.launcher().Exit(0, 2);
  fitrun::v1::Job failed = WaitForState(id, fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("trying again cannot help"));
  EXPECT_EQ(failed.restarts(), 0);
}

TEST_F(JobManagerTest, OutOfMemoryStopsThePeersAndReplansASmallerBatchWithTheSameGlobalBatch) {
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(Spec(2, 2));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  fitrun::v1::Job running = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  const fitrun::v1::Plan first = running.plan();
  ASSERT_EQ(first.per_device_batch(), 128);

  fitrun::v1::WorkerReport oom;
  oom.mutable_oom()->set_step(5);
  oom.mutable_oom()->set_per_device_batch(128);
  oom.mutable_oom()->set_live_bytes(3LL << 30);
  oom.mutable_oom()->set_requested_bytes(2LL << 30);  // far beyond what the estimate said
  oom.mutable_oom()->set_cap_bytes(4LL << 30);
  Report(job->id(), 1, 1, oom);
  // The peer is told to stop the moment the report arrives, before any process has exited; the rank
  // that ran out is left to exit with its own code and last report (killed only after the grace).
  EXPECT_EQ(jobs_.launcher().stopped(), (std::vector<int>{0}));
  EXPECT_EQ(jobs_.launcher().left_to_exit(), (std::vector<int>{1}));
  fitrun::v1::Job restarting = WaitForState(job->id(), fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(restarting.oom_replans(), 1);
  EXPECT_EQ(restarting.oom_history_size(), 1);
  EXPECT_EQ(restarting.oom_history(0).rank(), 1);
  EXPECT_EQ(jobs_.metrics().out_of_memory(), 1);
  EXPECT_EQ(jobs_.metrics().restarts("out_of_memory"), 1);

  jobs_.launcher().Exit(1, 3);
  jobs_.launcher().Exit(0, -1, 15);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(4, absl::Seconds(5)));
  fitrun::v1::Job replanned = WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
  const fitrun::v1::Plan second = AssignedPlan(jobs_.launcher().launches()[2]);
  EXPECT_LT(second.per_device_batch(), 128);
  EXPECT_EQ(second.device_ids_size() * second.per_device_batch() * second.grad_accum_steps(), 256);
  EXPECT_EQ(replanned.plan().per_device_batch(), second.per_device_batch());
  // The corrected estimate covers what the OOM measured, scaled down to the new batch.
  EXPECT_GT(second.predicted().activations_bytes(),
            first.predicted().activations_bytes() * second.per_device_batch() / 128);
  EXPECT_THAT(replanned.attempt_history(0).outcome(), HasSubstr("rank 1 ran out of memory at step 5"));
  EXPECT_EQ(replanned.attempt_history(0).ranks(1).exit_code(), 3);
}

TEST_F(JobManagerTest, OutOfMemoryExitWithoutAReportStillBoundsTheBatch) {
  const std::string id = SubmitAndWaitRunning(Spec(2, 2), 2);
  jobs_.launcher().Exit(0, 3);
  jobs_.launcher().Exit(1, -1, 15);
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(4, absl::Seconds(5)));
  WaitForState(id, fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedPlan(jobs_.launcher().launches()[2]).per_device_batch(), 64);
  EXPECT_EQ(jobs_.manager().Get(id)->oom_history(0).host_limit_bytes(), 0)
      << "the device's memory ran out, not the host's";
}

TEST_F(JobManagerTest, OutOfMemoryWithAFixedBatchFailsAndSaysWhy) {
  fitrun::v1::JobSpec spec = Spec(2, 2);
  spec.mutable_resources()->set_per_device_batch(128);
  const std::string id = SubmitAndWaitRunning(spec, 2);
  ReportOutOfMemory(id, 1, 0, /*step=*/1, /*batch=*/128);
  fitrun::v1::Job failed = WaitForState(id, fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("spec.resources.per_device_batch fixes the batch at 128"));
}

TEST_F(JobManagerTest, OutOfMemoryAtBatchOneFailsAtOnce) {
  fitrun::v1::JobSpec spec = Spec(2, 2);
  spec.set_global_batch_size(2);
  const std::string id = SubmitAndWaitRunning(spec, 2);
  ReportOutOfMemory(id, 1, 1, /*step=*/1, /*batch=*/1);
  fitrun::v1::Job failed = WaitForState(id, fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("even a per-device batch of 1 does not fit"));
  EXPECT_EQ(failed.oom_replans(), 0);
}

TEST_F(JobManagerTest, OutOfMemoryRetriesStopAtTheSpecLimit) {
  fitrun::v1::JobSpec spec = Spec(1, 1);
  spec.mutable_fault_tolerance()->set_max_oom_retries(1);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(spec);
  ASSERT_TRUE(job.ok());
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_TRUE(jobs_.launcher().WaitForLaunches(attempt, absl::Seconds(5)));
    WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
    const int64_t batch = AssignedPlan(jobs_.launcher().launches()[attempt - 1]).per_device_batch();
    ReportOutOfMemory(job->id(), attempt, 0, /*step=*/2, batch);
    jobs_.launcher().Exit(attempt - 1, 3);
  }
  fitrun::v1::Job failed = WaitForState(job->id(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("giving up after 1 re-plan(s)"));
  EXPECT_EQ(failed.oom_history_size(), 2);
}

// A rank's exit after the kernel's OOM killer struck in the attempt's cgroup, as the launcher says it.
WorkerExit HostMemoryOomExit(int64_t limit, int64_t peak) {
  WorkerExit exit;
  exit.exit_code = -1;
  exit.signal = 9;
  exit.host_memory_oom = true;
  exit.host_memory_limit_bytes = limit;
  exit.host_memory_peak_bytes = peak;
  return exit;
}

TEST_F(JobManagerTest, AHostMemoryOomIsReportedAndReplansASmallerBatchOnCpuDevices) {
  const std::string id = SubmitAndWaitRunning(Spec(2, 2), 2);
  // The attempt's processes may use, per rank, its device's 4 GiB and 2 GiB for the process, and
  // 512 tasks.
  ASSERT_EQ(jobs_.launcher().attempts().size(), 1u);
  EXPECT_EQ(jobs_.launcher().attempts()[0].host_memory_limit_bytes, 2 * (6LL << 30));
  EXPECT_EQ(jobs_.launcher().attempts()[0].max_processes, 1024);
  ASSERT_EQ(AssignedPlan(jobs_.launcher().launches()[0]).per_device_batch(), 128);

  jobs_.launcher().ExitWith(1, HostMemoryOomExit(12LL << 30, (12LL << 30) - 4096));
  fitrun::v1::Job restarting = WaitForState(id, fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(jobs_.launcher().stopped(), std::vector<int>{0});
  EXPECT_EQ(restarting.oom_replans(), 1);
  ASSERT_EQ(restarting.oom_history_size(), 1);
  EXPECT_EQ(restarting.oom_history(0).host_limit_bytes(), 12LL << 30) << "its host memory ran out, not its device's";
  EXPECT_EQ(jobs_.metrics().restarts("host_out_of_memory"), 1);
  EXPECT_THAT(restarting.attempt_history(0).outcome(),
              HasSubstr("rank 1 was killed by signal 9 (attempt 1): the attempt's processes reached their host "
                        "memory limit of 12.00 GiB (peak 12.00 GiB) and the kernel's OOM killer stopped one"));
  // Its own event, before the rank's exit, with the limit, the peak and the batch it ran.
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> events = jobs_.manager().ReadEvents(id, 1, 1000);
  ASSERT_TRUE(events.ok());
  int host_oom = -1, exited = -1;
  for (size_t i = 0; i < events->size(); ++i) {
    if ((*events)[i].has_host_memory_oom() && host_oom < 0) host_oom = static_cast<int>(i);
    if ((*events)[i].has_rank_exited() && exited < 0) exited = static_cast<int>(i);
  }
  ASSERT_GE(host_oom, 0);
  EXPECT_LT(host_oom, exited);
  const fitrun::v1::HostMemoryOom& oom = (*events)[host_oom].host_memory_oom();
  EXPECT_EQ(oom.rank(), 1);
  EXPECT_EQ(oom.attempt(), 1);
  EXPECT_EQ(oom.limit_bytes(), 12LL << 30);
  EXPECT_EQ(oom.peak_bytes(), (12LL << 30) - 4096);
  EXPECT_EQ(oom.per_device_batch(), 128);

  jobs_.launcher().Exit(0, -1, 15);
  EXPECT_EQ(jobs_.launcher().released(), std::vector<std::string>{"fake:0"});
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(4, absl::Seconds(5)));
  WaitForState(id, fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedPlan(jobs_.launcher().launches()[2]).per_device_batch(), 64);
}

TEST_F(JobManagerTest, AHostMemoryOomTheBatchCannotHelpFailsNamingTheLimitToRaise) {
  fitrun::v1::JobSpec spec = Spec(2, 2);
  spec.mutable_resources()->set_per_device_batch(128);
  std::string id = SubmitAndWaitRunning(spec, 2);
  jobs_.launcher().ExitWith(0, HostMemoryOomExit(12LL << 30, 12LL << 30));
  fitrun::v1::Job failed = WaitForState(id, fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("host memory limit of 12.00 GiB"));
  EXPECT_THAT(failed.failure_reason(),
              HasSubstr("spec.resources.per_device_batch fixes the batch at 128, so fitrun cannot try a smaller one; "
                        "raise spec.resources.host_memory (each rank may use 6.00 GiB now, the default)"));
  jobs_.launcher().Exit(1, -1, 15);

  // Past the re-plans the spec allows, the same.
  spec = Spec(1, 1);
  spec.mutable_resources()->set_host_memory("5GiB");
  spec.mutable_fault_tolerance()->set_max_oom_retries(0);
  id = SubmitAndWaitRunning(spec, 3);
  jobs_.launcher().ExitWith(2, HostMemoryOomExit(5LL << 30, 5LL << 30));
  failed = WaitForState(id, fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("giving up after 0 re-plan(s) (spec.fault_tolerance.max_oom_retries 0); "
                                                 "raise spec.resources.host_memory (each rank may use 5.00 GiB now)"));
}

TEST_F(JobManagerTest, SilentRankIsTakenAsHungAndTheGroupRestarts) {
  fitrun::v1::JobSpec spec = Spec(2, 2);
  spec.mutable_fault_tolerance()->set_heartbeat_timeout_seconds(1);
  const std::string id = SubmitAndWaitRunning(spec, 2);
  // Rank 0 keeps reporting; rank 1 says nothing.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  fitrun::v1::WorkerReport heartbeat;
  heartbeat.mutable_heartbeat()->set_step(1);
  while (jobs_.manager().Get(id)->state() == fitrun::v1::JOB_STATE_RUNNING && absl::Now() < deadline) {
    Report(id, 1, 0, heartbeat);
    absl::SleepFor(absl::Milliseconds(100));
  }
  fitrun::v1::Job restarting = WaitForState(id, fitrun::v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(restarting.attempt_history(0).outcome(), HasSubstr("rank 1 sent nothing for"));
  EXPECT_EQ(jobs_.metrics().restarts("hang"), 1);
  EXPECT_EQ(jobs_.launcher().stopped(), (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace fitrun::server
