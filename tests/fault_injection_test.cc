// Faults injected into real jobs (real fitrund, real ranks over Gloo, real Fashion-MNIST): an OOM on
// one rank, a SIGKILLed rank, a SIGSTOPped rank, fitrund SIGKILLed while a group restarts, and the
// checkpoint directory turned read-only mid-run. Each must end as it should, leave no process
// behind and, where it recovers, end with the loss of an undisturbed run of the same global batch.
//
// The suite prints what it measured: OOM -> every rank stopped, and OOM -> training resumed.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/testing/coordinator.h"

namespace fitrun::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kTwoDevices[] = "cpu:2x2GiB";
// Long enough to be hit mid-run on this machine (a step takes ~15 ms), short enough for the suite.
constexpr int kSteps = 400;
constexpr char kCheckpoints[] = "checkpoint: {every_steps: 50}\n";

absl::Time TimeOf(const fitrun::v1::JobEvent& event) {
  return absl::FromUnixSeconds(event.time().seconds()) + absl::Nanoseconds(event.time().nanos());
}

// Reads the job's events live until `predicate` holds for one of them; returns that event.
std::optional<fitrun::v1::JobEvent> WatchUntil(RunningCoordinator& coordinator, const std::string& job_id,
                                               const std::function<bool(const fitrun::v1::JobEvent&)>& predicate,
                                               absl::Duration timeout = absl::Seconds(120)) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  fitrun::v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = coordinator.stub().WatchJob(&context, request);
  fitrun::v1::JobEvent event;
  std::optional<fitrun::v1::JobEvent> found;
  while (!found && reader->Read(&event)) {
    if (predicate(event)) found = event;
  }
  context.TryCancel();
  reader->Finish();
  return found;
}

bool IsProgressAtLeast(const fitrun::v1::JobEvent& event, int64_t step) {
  return event.has_progress() && event.progress().rank() == 0 && event.progress().step() >= step;
}

// The final loss of the same job undisturbed, trained once for the whole suite.
double UndisturbedLoss() {
  static const double loss = [] {
    RunningCoordinator coordinator("faults-baseline", kTwoDevices);
    const double kNoLoss = std::nan("");
    if (!coordinator.ok()) return kNoLoss;
    absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml("baseline", kSteps, kCheckpoints));
    if (!job.ok()) return kNoLoss;
    coordinator.Watch(job->id());
    const fitrun::v1::Job done = coordinator.Get(job->id());
    return done.state() == fitrun::v1::JOB_STATE_SUCCEEDED ? done.result().final_loss() : kNoLoss;
  }();
  return loss;
}

// A restart with the same plan from a checkpoint replays the undisturbed run bit for bit. A re-plan
// keeps the global batch and the samples, but accumulating two half batches rounds differently, and
// hundreds of steps of SGD with momentum grow that into a visible but small difference. A restart
// that lost or repeated steps, or resumed from the wrong place, lands further away.
constexpr double kSamePlan = 1e-5;
constexpr double kReplanned = 0.02;

void ExpectLossOfAnUndisturbedRun(const fitrun::v1::Job& job, double tolerance) {
  const double baseline = UndisturbedLoss();
  ASSERT_FALSE(std::isnan(baseline)) << "the undisturbed run did not succeed";
  std::printf("%s: final loss %.5f, undisturbed run %.5f\n", job.spec().name().c_str(), job.result().final_loss(),
              baseline);
  EXPECT_NEAR(job.result().final_loss(), baseline, tolerance);
  EXPECT_EQ(job.result().steps(), kSteps);
}

void ExpectNoWorkerLeft(RunningCoordinator& coordinator) {
  EXPECT_TRUE(WaitFor([&] { return WorkersUnder(coordinator.state_dir()).empty(); }, absl::Seconds(10)))
      << WorkersUnder(coordinator.state_dir()).size() << " worker(s) left";
}

TEST(FaultInjectionTest, OutOfMemoryOnRankOneStopsEveryRankAndResumesWithASmallerBatch) {
  RunningCoordinator coordinator("faults-oom", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml(
      "oom", kSteps, absl::StrCat(kCheckpoints, "fault_injection: {kind: oom, rank: 1, at_step: 120}\n")));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << ReadFile(coordinator.log_path());

  // One re-plan: the same two devices, a smaller per-device batch, the same global batch.
  ASSERT_EQ(done.attempt_history_size(), 2);
  EXPECT_EQ(done.oom_replans(), 1);
  EXPECT_THAT(done.attempt_history(0).outcome(), HasSubstr("rank 1 ran out of memory at step 120"));
  EXPECT_EQ(done.attempt_history(0).per_device_batch(), 128);
  const fitrun::v1::AttemptRecord& second = done.attempt_history(1);
  EXPECT_LT(second.per_device_batch(), 128);
  EXPECT_EQ(second.device_ids_size() * second.per_device_batch() * second.grad_accum_steps(), 256);
  ASSERT_EQ(done.oom_history_size(), 1);
  EXPECT_EQ(done.oom_history(0).rank(), 1);
  EXPECT_EQ(done.oom_history(0).cap_bytes(), 2LL << 30);
  EXPECT_GT(done.oom_history(0).requested_bytes(), 0);

  // The times, from the coordinator's own event timestamps.
  std::optional<absl::Time> oom_at, all_stopped_at, relaunched_at, resumed_at;
  int attempt = 1, exited_in_first = 0;
  int64_t resumed_from_step = 0;
  for (const auto& event : events) {
    if (event.has_oom() && !oom_at) oom_at = TimeOf(event);
    if (event.has_plan_chosen()) attempt = event.plan_chosen().attempt();
    if (event.has_rank_exited() && attempt == 1 && ++exited_in_first == 2) all_stopped_at = TimeOf(event);
    if (event.has_state_changed() && event.state_changed().to() == fitrun::v1::JOB_STATE_RUNNING && attempt == 2) {
      relaunched_at = TimeOf(event);
    }
    if (event.has_progress() && attempt == 2 && !resumed_at) {
      resumed_at = TimeOf(event);
      resumed_from_step = event.progress().step();
    }
  }
  ASSERT_TRUE(oom_at && all_stopped_at && relaunched_at && resumed_at);
  const double stopped_s = absl::ToDoubleSeconds(*all_stopped_at - *oom_at);
  const double resumed_s = absl::ToDoubleSeconds(*resumed_at - *oom_at);
  std::printf("fault-injection timing: OOM -> every rank stopped %.2f s (target 2 s); "
              "OOM -> training resumed %.2f s (target 2 s); of which re-planned and launched after %.2f s, "
              "first step of the new attempt %.2f s after launch\n",
              stopped_s, resumed_s, absl::ToDoubleSeconds(*relaunched_at - *oom_at),
              absl::ToDoubleSeconds(*resumed_at - *relaunched_at));
  RecordProperty("oom_to_stopped_seconds", absl::StrCat(stopped_s));
  RecordProperty("oom_to_resumed_seconds", absl::StrCat(resumed_s));
  // Resumed from the last checkpoint (step 100), not from the start.
  EXPECT_GT(resumed_from_step, 100);
  EXPECT_LE(resumed_from_step, 120);
  ExpectLossOfAnUndisturbedRun(done, kReplanned);
  EXPECT_THAT(coordinator.Metrics(), HasSubstr("fitrun_out_of_memory_total 1"));
  EXPECT_THAT(coordinator.Metrics(), HasSubstr("fitrun_job_restarts_total{reason=\"out_of_memory\"} 1"));
  ExpectNoWorkerLeft(coordinator);
}

TEST(FaultInjectionTest, SigkilledRankRestartsTheGroupFromTheLastCheckpoint) {
  RunningCoordinator coordinator("faults-sigkill", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml("sigkill", kSteps, kCheckpoints));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WatchUntil(coordinator, job->id(), [](const auto& e) { return IsProgressAtLeast(e, 60); }));
  const fitrun::v1::Job running = coordinator.Get(job->id());
  ASSERT_EQ(running.attempt_history_size(), 1);
  ASSERT_EQ(kill(running.attempt_history(0).ranks(1).pid(), SIGKILL), 0);

  coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << ReadFile(coordinator.log_path());
  ASSERT_EQ(done.attempt_history_size(), 2);
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_THAT(done.attempt_history(0).outcome(), HasSubstr("rank 1 was killed by signal 9"));
  EXPECT_EQ(done.attempt_history(0).ranks(1).signal(), SIGKILL);
  // The same plan again: a crash says nothing about memory.
  EXPECT_EQ(done.attempt_history(1).per_device_batch(), done.attempt_history(0).per_device_batch());
  ExpectLossOfAnUndisturbedRun(done, kSamePlan);
  EXPECT_THAT(coordinator.Metrics(), HasSubstr("fitrun_job_restarts_total{reason=\"crash\"} 1"));
  ExpectNoWorkerLeft(coordinator);
}

TEST(FaultInjectionTest, SigstoppedRankIsCaughtByItsSilenceAndTheGroupRestarts) {
  RunningCoordinator coordinator("faults-sigstop", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  // The heartbeat timeout (3 s) well inside the collective timeout (60 s): silence is what catches it.
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml(
      "sigstop", kSteps, absl::StrCat(kCheckpoints, "fault_tolerance: {heartbeat_timeout_seconds: 3}\n")));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WatchUntil(coordinator, job->id(), [](const auto& e) { return IsProgressAtLeast(e, 60); }));
  const fitrun::v1::Job running = coordinator.Get(job->id());
  const int stopped_pid = running.attempt_history(0).ranks(1).pid();
  const absl::Time stopped_at = absl::Now();
  ASSERT_EQ(kill(stopped_pid, SIGSTOP), 0);

  coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << ReadFile(coordinator.log_path());
  ASSERT_EQ(done.attempt_history_size(), 2);
  EXPECT_THAT(done.attempt_history(0).outcome(), HasSubstr("rank 1 sent nothing for"));
  EXPECT_THAT(done.attempt_history(0).outcome(), HasSubstr("heartbeat_timeout_seconds 3"));
  const absl::Time ended = absl::FromUnixSeconds(done.attempt_history(0).ended_at().seconds());
  EXPECT_LT(ended - stopped_at, absl::Seconds(30)) << "the stopped rank was not caught before the collective timeout";
  ExpectLossOfAnUndisturbedRun(done, kSamePlan);
  EXPECT_THAT(coordinator.Metrics(), HasSubstr("fitrun_job_restarts_total{reason=\"hang\"} 1"));
  ExpectNoWorkerLeft(coordinator);
}

TEST(FaultInjectionTest, SigkilledCoordinatorDuringARestartStillRunsOneAttemptAtATime) {
  RunningCoordinator coordinator("faults-coordinator", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  // Rank 1 crashes at step 120; fitrund is killed as soon as the job is RESTARTING, while it is
  // still stopping the old rank 0 and before the new attempt is launched.
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml(
      "coordinator-dies", kSteps,
      absl::StrCat(kCheckpoints, "fault_injection: {kind: exit, rank: 1, at_step: 120, exit_code: 7}\n")));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WatchUntil(coordinator, job->id(), [](const fitrun::v1::JobEvent& e) {
    return e.has_state_changed() && e.state_changed().to() == fitrun::v1::JOB_STATE_RESTARTING;
  }));
  coordinator.Kill();
  ASSERT_TRUE(coordinator.Restart()) << ReadFile(coordinator.log_path());

  coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << ReadFile(coordinator.log_path());
  ASSERT_EQ(done.attempt_history_size(), 2);
  EXPECT_THAT(done.attempt_history(0).outcome(), HasSubstr("rank 1 exited with code 7"));
  // Never two attempts at once: the first one's ranks were all gone before the second started.
  for (const auto& rank : done.attempt_history(0).ranks()) EXPECT_TRUE(rank.exited()) << "rank " << rank.rank();
  const auto nanos = [](const google::protobuf::Timestamp& t) { return t.seconds() * 1000000000 + t.nanos(); };
  EXPECT_LE(nanos(done.attempt_history(0).ended_at()), nanos(done.attempt_history(1).started_at()));
  ExpectLossOfAnUndisturbedRun(done, kSamePlan);
  ExpectNoWorkerLeft(coordinator);
}

// Makes a directory refuse new entries for every user, root included (the immutable attribute,
// which root cannot bypass as it does permission bits), and undoes it on destruction.
class ReadOnlyDirectory {
 public:
  explicit ReadOnlyDirectory(const std::string& path) : fd_(open(path.c_str(), O_RDONLY | O_DIRECTORY)) {
    int flags = 0;
    if (fd_ >= 0 && ioctl(fd_, FS_IOC_GETFLAGS, &flags) == 0) {
      flags |= FS_IMMUTABLE_FL;
      ok_ = ioctl(fd_, FS_IOC_SETFLAGS, &flags) == 0;
    }
    if (!ok_) ok_ = chmod(path.c_str(), 0555) == 0 && geteuid() != 0;  // without the attribute, for non-root
    path_ = path;
  }
  ~ReadOnlyDirectory() {
    int flags = 0;
    if (fd_ >= 0 && ioctl(fd_, FS_IOC_GETFLAGS, &flags) == 0) {
      flags &= ~FS_IMMUTABLE_FL;
      (void)ioctl(fd_, FS_IOC_SETFLAGS, &flags);
    }
    (void)chmod(path_.c_str(), 0755);
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ok_; }

 private:
  int fd_;
  bool ok_ = false;
  std::string path_;
};

TEST(FaultInjectionTest, ReadOnlyCheckpointDirectoryIsReportedAndThePreviousCheckpointSurvives) {
  RunningCoordinator coordinator("faults-readonly", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml("read-only", kSteps, kCheckpoints));
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<fitrun::v1::JobEvent> first =
      WatchUntil(coordinator, job->id(), [](const fitrun::v1::JobEvent& e) { return e.has_checkpoint_saved(); });
  ASSERT_TRUE(first.has_value());
  const std::string saved = first->checkpoint_saved().path();
  const std::string dir = std::filesystem::path(saved).parent_path().string();
  const auto saved_size = std::filesystem::file_size(saved);
  std::optional<ReadOnlyDirectory> read_only;
  read_only.emplace(dir);
  ASSERT_TRUE(read_only->ok()) << "cannot make " << dir << " read-only on this filesystem";

  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  read_only.reset();
  // Checkpoints are insurance, not the job: training goes on and ends, and every failed save is said.
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << ReadFile(coordinator.log_path());
  int failed_saves = 0, later_saves = 0;
  for (const auto& event : events) {
    if (event.has_checkpoint_failed()) {
      EXPECT_FALSE(event.checkpoint_failed().error().empty());
      ++failed_saves;
    }
    if (event.has_checkpoint_saved() && event.checkpoint_saved().step() > first->checkpoint_saved().step()) {
      ++later_saves;
    }
  }
  EXPECT_GE(failed_saves, 1);
  EXPECT_EQ(later_saves, 0);
  // The previous checkpoint is whole, and no temporary file was left beside it.
  ASSERT_TRUE(std::filesystem::exists(saved));
  EXPECT_EQ(std::filesystem::file_size(saved), saved_size);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().extension(), ".pt") << entry.path();
  }
  ExpectNoWorkerLeft(coordinator);
}

}  // namespace
}  // namespace fitrun::testing
