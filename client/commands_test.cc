#include "client/commands.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/fake_coordinator.h"
#include "client/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;
using ::testing::StartsWith;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

class CommandsTest : public ::testing::Test {
 protected:
  CommandsTest() {
    env_.coordinator = &coordinator_;
    env_.out = &out_;
    env_.err = &err_;
    // Time moves only when watch sleeps between reconnections.
    env_.now = [this] { return now_; };
    env_.sleep = [this](absl::Duration d) { now_ += d; };
  }

  // A spec file in the test's private temporary directory.
  std::string WriteSpec(const std::string& text) {
    const std::string path = ::testing::TempDir() + "/spec.yaml";
    std::ofstream(path) << text;
    return path;
  }

  absl::Time now_ = kNow;
  FakeCoordinator coordinator_;
  std::ostringstream out_;
  std::ostringstream err_;
  CommandEnv env_;
};

v1::Job JobInState(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  return job;
}

v1::JobEvent StateEvent(int64_t sequence, v1::JobState from, v1::JobState to) {
  v1::JobEvent event;
  event.set_sequence(sequence);
  event.mutable_state_changed()->set_from(from);
  event.mutable_state_changed()->set_to(to);
  return event;
}

v1::JobEvent ProgressEvent(int64_t sequence, int32_t rank, int64_t step) {
  v1::JobEvent event;
  event.set_sequence(sequence);
  event.mutable_progress()->set_rank(rank);
  event.mutable_progress()->set_step(step);
  event.mutable_progress()->set_total_steps(10);
  event.mutable_progress()->set_loss(0.5);
  return event;
}

TEST_F(CommandsTest, SubmitSendsTheFileTextVerbatim) {
  const std::string spec = "name: mnist\nmodel: {builtin: mlp}\n# comment kept\n";
  coordinator_.submit_reply = JobInState("j-7", v1::JOB_STATE_QUEUED);
  EXPECT_EQ(RunSubmit(env_, WriteSpec(spec), /*watch=*/false), kExitOk);
  EXPECT_THAT(coordinator_.submitted_specs, ElementsAre(spec));
  EXPECT_EQ(out_.str(), "submitted job j-7\n");
  EXPECT_EQ(err_.str(), "");
  EXPECT_THAT(coordinator_.watches, IsEmpty());
}

TEST_F(CommandsTest, SubmitPrintsInvalidArgumentVerbatim) {
  coordinator_.submit_reply = absl::InvalidArgumentError(
      "spec.resources.max_devices: must be >= min_devices (got 1 < 2)");
  EXPECT_EQ(RunSubmit(env_, WriteSpec("x: 1\n"), false), kExitRejected);
  EXPECT_EQ(err_.str(),
            "error: INVALID_ARGUMENT: spec.resources.max_devices: must be >= min_devices (got 1 "
            "< 2)\n");
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, MissingSpecFileNamesThePathAndSendsNothing) {
  const std::string path = ::testing::TempDir() + "/no-such-spec.yaml";
  EXPECT_EQ(RunSubmit(env_, path, false), kExitLocalError);
  EXPECT_EQ(err_.str(),
            "error: cannot read spec file " + path + ": No such file or directory\n");
  EXPECT_THAT(coordinator_.submitted_specs, IsEmpty());

  err_.str("");
  EXPECT_EQ(RunPlan(env_, ::testing::TempDir(), false), kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read spec file " + ::testing::TempDir()));
  EXPECT_THAT(coordinator_.planned_specs, IsEmpty());
}

TEST_F(CommandsTest, SubmitWithWatchFollowsTheNewJob) {
  coordinator_.submit_reply = JobInState("j-8", v1::JOB_STATE_QUEUED);
  coordinator_.watch_events = {StateEvent(1, v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED)};
  coordinator_.get_reply = JobInState("j-8", v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(RunSubmit(env_, WriteSpec("name: x\n"), /*watch=*/true), kExitJobCancelled);
  EXPECT_THAT(coordinator_.watches, ElementsAre(Pair("j-8", 1)));
  EXPECT_EQ(out_.str(), "submitted job j-8\nstate: QUEUED\njob j-8 CANCELLED\n");
}

TEST_F(CommandsTest, EventsPrintsTheStoredHistoryOneJsonObjectPerLine) {
  v1::Job done = JobInState("j-1", v1::JOB_STATE_SUCCEEDED);
  done.set_last_sequence(3);
  coordinator_.get_reply = done;
  coordinator_.watch_events = {
      StateEvent(1, v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_RUNNING),
      ProgressEvent(2, 0, 10),
      StateEvent(3, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED),
  };
  EXPECT_EQ(RunEvents(env_, "j-1"), kExitOk);
  const std::vector<std::string> lines = absl::StrSplit(out_.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << out_.str();
  EXPECT_THAT(lines[1], HasSubstr("\"sequence\":\"2\""));
  EXPECT_THAT(lines[1], HasSubstr("\"progress\":{"));
  EXPECT_THAT(lines[2], HasSubstr("JOB_STATE_SUCCEEDED"));
}

TEST_F(CommandsTest, WatchReplaysFromTheStartAndPrintsTheResult) {
  v1::Job done = JobInState("j-1", v1::JOB_STATE_SUCCEEDED);
  done.mutable_result()->set_test_accuracy(0.8412);
  done.mutable_result()->set_has_test_accuracy(true);
  done.mutable_result()->set_final_loss(0.3);
  done.mutable_result()->set_steps(10);
  done.mutable_result()->set_train_seconds(75);
  coordinator_.get_reply = done;
  coordinator_.watch_events = {
      StateEvent(1, v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_RUNNING),
      ProgressEvent(2, 0, 10),
      StateEvent(3, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED),
  };

  EXPECT_EQ(RunWatch(env_, "j-1"), kExitOk);
  EXPECT_THAT(coordinator_.watches, ElementsAre(Pair("j-1", 1)));
  EXPECT_THAT(coordinator_.got_job_ids, ElementsAre("j-1"));
  EXPECT_EQ(out_.str(),
            "state: RUNNING\n"
            "step 10/10 (100.0%)  epoch 0  loss 0.5000  0.0 samples/s  ETA --\n"
            "state: RUNNING -> SUCCEEDED\n"
            "job j-1 SUCCEEDED\n"
            "test accuracy: 0.8412\n"
            "final loss:    0.3000\n"
            "steps:         10\n"
            "train time:    1m15s\n");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, WatchExitCodesFollowTheOutcome) {
  coordinator_.get_reply = JobInState("j-1", v1::JOB_STATE_FAILED);
  coordinator_.get_reply->set_failure_reason("rank 1 exited with code 3");
  EXPECT_EQ(RunWatch(env_, "j-1"), kExitJobFailed);
  EXPECT_THAT(out_.str(), HasSubstr("job j-1 FAILED: rank 1 exited with code 3\n"));

  coordinator_.get_reply = JobInState("j-1", v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(RunWatch(env_, "j-1"), kExitJobCancelled);
}

TEST_F(CommandsTest, WatchReportsABrokenStream) {
  coordinator_.watch_events = {ProgressEvent(1, 0, 3), ProgressEvent(2, 0, 4)};
  coordinator_.watch_end = absl::UnavailableError("Socket closed");
  EXPECT_EQ(RunWatch(env_, "j-1"), kExitTransport);
  EXPECT_THAT(err_.str(), StartsWith("lost the coordinator (Socket closed); reconnecting to resume after event 2\n"));
  EXPECT_THAT(err_.str(), HasSubstr("error: UNAVAILABLE: Socket closed\n"));
  EXPECT_THAT(err_.str(), HasSubstr("broke after event 2"));
  // It kept trying for the reconnection window, always resuming after the last event seen.
  EXPECT_GE(now_ - kNow, env_.reconnect_for);
  EXPECT_THAT(coordinator_.watches.back(), Pair("j-1", 3));
  // The latest progress is still shown before the error.
  EXPECT_THAT(out_.str(), HasSubstr("step 4/10"));
  EXPECT_THAT(coordinator_.got_job_ids, IsEmpty());
}

TEST_F(CommandsTest, WatchReconnectsAfterACoordinatorRestartAndResumesWithoutGapsOrRepeats) {
  coordinator_.watch_events = {
      StateEvent(1, v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_RUNNING),
      ProgressEvent(2, 0, 3),
      ProgressEvent(3, 0, 4),
      StateEvent(4, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED),
  };
  coordinator_.watch_end = absl::UnavailableError("Socket closed");
  coordinator_.break_after_sequence = 2;
  // Down twice more, then back with the rest of the events.
  coordinator_.watch_ends_then = {absl::UnavailableError("failed to connect"), absl::UnavailableError("failed to connect"),
                                  absl::OkStatus()};
  coordinator_.get_reply = JobInState("j-1", v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(RunWatch(env_, "j-1"), kExitOk);
  EXPECT_THAT(coordinator_.watches, ElementsAre(Pair("j-1", 1), Pair("j-1", 3), Pair("j-1", 3), Pair("j-1", 3)));
  EXPECT_THAT(err_.str(), HasSubstr("reconnecting to resume after event 2"));
  EXPECT_THAT(out_.str(), HasSubstr("SUCCEEDED"));
}

TEST_F(CommandsTest, ListFiltersByStateAndRejectsUnknownStates) {
  coordinator_.list_reply = v1::ListJobsResponse();
  EXPECT_EQ(RunList(env_, false, {"running", "QUEUED"}), kExitOk);
  EXPECT_THAT(coordinator_.listed_states, ElementsAre(v1::JOB_STATE_RUNNING, v1::JOB_STATE_QUEUED));
  EXPECT_EQ(RunList(env_, false, {"sleeping"}), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--state: unknown state 'sleeping'"));
}

TEST_F(CommandsTest, LogsPrintsTheChunksVerbatim) {
  v1::LogChunk first;
  first.set_data("step 1\n");
  v1::LogChunk second;
  second.set_data("step 2\n");
  coordinator_.log_chunks = {first, second};
  EXPECT_EQ(RunLogs(env_, "j-1", 1, /*follow=*/false), kExitOk);
  EXPECT_EQ(out_.str(), "step 1\nstep 2\n");
  EXPECT_THAT(coordinator_.logs_requested, ElementsAre(Pair("j-1", 1)));
  coordinator_.logs_end = absl::NotFoundError("job_id: no job 'j-9'");
  EXPECT_EQ(RunLogs(env_, "j-9", 0, false), kExitRejected);
}

TEST_F(CommandsTest, WatchOfAnUnknownJobIsRejected) {
  coordinator_.watch_end = absl::NotFoundError("job j-404 not found");
  EXPECT_EQ(RunWatch(env_, "j-404"), kExitRejected);
  EXPECT_EQ(err_.str(), "error: NOT_FOUND: job j-404 not found\n");
}

TEST_F(CommandsTest, WatchStreamEndingEarlyIsATransportError) {
  coordinator_.get_reply = JobInState("j-1", v1::JOB_STATE_RUNNING);
  EXPECT_EQ(RunWatch(env_, "j-1"), kExitTransport);
  EXPECT_THAT(err_.str(), HasSubstr("while it is still RUNNING"));
}

TEST_F(CommandsTest, GetPrintsHumanOrJson) {
  coordinator_.get_reply = JobInState("j-3", v1::JOB_STATE_QUEUED);
  EXPECT_EQ(RunGet(env_, "j-3", /*json=*/false), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("state: QUEUED\n"));

  out_.str("");
  EXPECT_EQ(RunGet(env_, "j-3", /*json=*/true), kExitOk);
  EXPECT_THAT(out_.str(), StartsWith("{"));
  EXPECT_THAT(out_.str(), HasSubstr("\"state\": \"JOB_STATE_QUEUED\""));
  EXPECT_THAT(out_.str(), HasSubstr("\"attempts\": 0"));
}

v1::JobEvent LossEvent(int64_t sequence, int32_t rank, int64_t step, double loss) {
  v1::JobEvent event = ProgressEvent(sequence, rank, step);
  event.mutable_progress()->set_loss(loss);
  return event;
}

v1::Job RunningJobAt(int64_t step, int64_t last_sequence) {
  v1::Job job = JobInState("j-1", v1::JOB_STATE_RUNNING);
  job.mutable_last_progress()->set_step(step);
  job.mutable_last_progress()->set_total_steps(10);
  job.mutable_last_progress()->set_loss(0.75);
  job.set_last_sequence(last_sequence);
  return job;
}

TEST_F(CommandsTest, GetDrawsRankZerosLossUpToTheJobsLastEvent) {
  coordinator_.get_reply = RunningJobAt(8, 7);
  coordinator_.watch_events = {
      StateEvent(1, v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_RUNNING),
      LossEvent(2, 0, 2, 2.0),
      LossEvent(3, 1, 2, 9.0),  // rank 1: not drawn
      LossEvent(4, 0, 4, 1.0),
      LossEvent(5, 0, 6, 0.5),
      LossEvent(6, 1, 8, 9.0),
      LossEvent(7, 0, 8, 0.75),
      LossEvent(8, 0, 9, 99.0),  // after GetJob answered: not part of what get shows
  };
  EXPECT_EQ(RunGet(env_, "j-1", /*json=*/false), kExitOk);
  ASSERT_EQ(coordinator_.event_reads.size(), 1u);
  EXPECT_EQ(coordinator_.event_reads[0].job_id, "j-1");
  EXPECT_EQ(coordinator_.event_reads[0].from_sequence, 1);
  EXPECT_EQ(coordinator_.event_reads[0].to_sequence, 7);
  EXPECT_THAT(out_.str(), HasSubstr("\nloss curve: 2.0000 █▃▁▂ 0.7500  (steps 2-8; min 0.5000 at step 6)\n"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, GetReadsNoEventsForAJobWithoutProgressOrForJson) {
  coordinator_.get_reply = JobInState("j-1", v1::JOB_STATE_QUEUED);
  coordinator_.get_reply->set_last_sequence(1);
  EXPECT_EQ(RunGet(env_, "j-1", false), kExitOk);
  EXPECT_THAT(out_.str(), Not(HasSubstr("loss curve")));

  coordinator_.get_reply = RunningJobAt(8, 7);
  EXPECT_EQ(RunGet(env_, "j-1", /*json=*/true), kExitOk);
  EXPECT_THAT(coordinator_.event_reads, IsEmpty());
}

TEST_F(CommandsTest, GetStillPrintsTheJobWhenItsHistoryCannotBeRead) {
  coordinator_.get_reply = RunningJobAt(8, 7);
  coordinator_.watch_events = {LossEvent(2, 0, 2, 2.0), LossEvent(4, 0, 4, 1.0)};
  coordinator_.read_events_end = absl::DeadlineExceededError("Deadline Exceeded");
  EXPECT_EQ(RunGet(env_, "j-1", false), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("state:    RUNNING\n"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("loss curve")));
  EXPECT_EQ(err_.str(), "note: loss curve left out: DEADLINE_EXCEEDED: Deadline Exceeded\n");
}

TEST_F(CommandsTest, ErrorsUseTheCodeName) {
  coordinator_.get_reply = absl::NotFoundError("job j-9 not found");
  EXPECT_EQ(RunGet(env_, "j-9", false), kExitRejected);
  EXPECT_EQ(err_.str(), "error: NOT_FOUND: job j-9 not found\n");

  err_.str("");
  coordinator_.list_reply = absl::UnavailableError("failed to connect to all addresses");
  EXPECT_EQ(RunList(env_, false), kExitTransport);
  EXPECT_EQ(err_.str(), "error: UNAVAILABLE: failed to connect to all addresses\n");

  err_.str("");
  coordinator_.devices_reply = absl::DeadlineExceededError("Deadline Exceeded");
  EXPECT_EQ(RunDevices(env_, false), kExitTransport);
  EXPECT_EQ(err_.str(), "error: DEADLINE_EXCEEDED: Deadline Exceeded\n");
}

TEST_F(CommandsTest, ListAndDevicesPrintTables) {
  coordinator_.list_reply = v1::ListJobsResponse();
  *coordinator_.list_reply->add_jobs() = JobInState("j-1", v1::JOB_STATE_QUEUED);
  EXPECT_EQ(RunList(env_, false), kExitOk);
  EXPECT_THAT(out_.str(), StartsWith("ID   NAME  STATE   DEVICES  STEP  LOSS  AGE\n"));

  out_.str("");
  coordinator_.devices_reply = v1::ListDevicesResponse();
  EXPECT_EQ(RunDevices(env_, true), kExitOk);
  EXPECT_EQ(out_.str(), "{\n \"devices\": []\n}\n");
}

TEST_F(CommandsTest, PlanSendsTheSpecAndPrintsThePlan) {
  v1::PlanJobResponse plan;
  plan.mutable_plan()->add_device_ids("cpu:0");
  plan.mutable_plan()->set_per_device_batch(128);
  plan.mutable_plan()->set_grad_accum_steps(1);
  coordinator_.plan_reply = plan;
  EXPECT_EQ(RunPlan(env_, WriteSpec("name: p\n"), false), kExitOk);
  EXPECT_THAT(coordinator_.planned_specs, ElementsAre("name: p\n"));
  EXPECT_THAT(out_.str(), HasSubstr("per-device batch:  128\n"));
}

TEST_F(CommandsTest, CancelSaysWhetherTheJobHasStoppedYet) {
  coordinator_.cancel_reply = JobInState("j-5", v1::JOB_STATE_RUNNING);
  EXPECT_EQ(RunCancel(env_, "j-5", "no longer needed"), kExitOk);
  EXPECT_THAT(coordinator_.cancelled, ElementsAre(Pair("j-5", "no longer needed")));
  EXPECT_EQ(out_.str(), "cancelling job j-5 (now RUNNING)\n");

  out_.str("");
  coordinator_.cancel_reply = JobInState("j-5", v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(RunCancel(env_, "j-5", ""), kExitOk);
  EXPECT_EQ(out_.str(), "cancelled job j-5\n");
}

class TopCommandTest : public CommandsTest {
 protected:
  TopCommandTest() {
    v1::ListDevicesResponse devices;
    v1::Device* device = devices.add_devices();
    device->set_id("cpu:0");
    device->set_name("virtual CPU device");
    device->set_total_bytes(int64_t{1} << 30);
    device->set_free_bytes(int64_t{1} << 29);
    device->set_job_id("j-1");
    device->set_planned_bytes(int64_t{1} << 29);
    coordinator_.devices_reply = devices;
    v1::ListJobsResponse jobs;
    *jobs.add_jobs() = RunningJobAt(8, 7);
    coordinator_.list_reply = jobs;
    env_.sleep = [this](absl::Duration d) {
      sleeps_.push_back(d);
      now_ += d;
    };
    env_.terminal_size = [] { return TerminalSize{100, 30}; };
  }

  // Ctrl-C arrives once the clock has moved this far.
  void InterruptAfter(absl::Duration after) {
    env_.interrupted = [this, after] { return now_ - kNow >= after; };
  }

  static int Count(const std::string& text, const std::string& what) {
    int count = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++count;
    return count;
  }

  std::vector<absl::Duration> sleeps_;
};

TEST_F(TopCommandTest, IntoAPipeItPrintsOneFramePlainAndExits) {
  env_.out_is_terminal = false;
  EXPECT_EQ(RunTop(env_, {}), kExitOk);
  EXPECT_EQ(coordinator_.list_devices_calls, 1);
  EXPECT_EQ(coordinator_.list_jobs_calls, 1);
  EXPECT_THAT(coordinator_.listed_states, ElementsAre(v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING,
                                                      v1::JOB_STATE_PLANNING, v1::JOB_STATE_QUEUED));
  EXPECT_THAT(out_.str(), StartsWith("fitrun top  2023-11-14 22:13:20 UTC  devices: 1 (1 held)  jobs: 1 running\n"));
  EXPECT_THAT(out_.str(), HasSubstr("\ncpu:0   virtual CPU device  1.0 GiB  512.0 MiB  512.0 MiB     -  [.....|......]  j-1 rank 0\n"));
  EXPECT_THAT(out_.str(), HasSubstr("\nj-1        -      RUNNING  8/10  0.7500"));
  EXPECT_EQ(out_.str().find('\033'), std::string::npos);
  EXPECT_THAT(sleeps_, IsEmpty());
  EXPECT_EQ(err_.str(), "");
}

TEST_F(TopCommandTest, OnceOnATerminalPrintsOneFrameCutToItsWidth) {
  env_.out_is_terminal = true;
  env_.terminal_size = [] { return TerminalSize{40, 10}; };
  EXPECT_EQ(RunTop(env_, {absl::Seconds(2), /*once=*/true}), kExitOk);
  EXPECT_EQ(coordinator_.list_devices_calls, 1);
  EXPECT_EQ(out_.str().find('\033'), std::string::npos);
  std::vector<std::string> lines = absl::StrSplit(out_.str(), '\n');
  EXPECT_GT(lines.size(), 10u);  // cut to the width only: a single print may scroll
  for (const std::string& line : lines) EXPECT_LE(DisplayWidth(line), 40u) << line;
}

TEST_F(TopCommandTest, OnATerminalItRedrawsInPlaceEveryIntervalUntilCtrlC) {
  env_.out_is_terminal = true;
  InterruptAfter(absl::Seconds(5));
  EXPECT_EQ(RunTop(env_, {}), kExitOk);
  // Frames at 0 s, 2 s and 4 s; Ctrl-C at 5 s is seen within 100 ms, not at the next refresh.
  EXPECT_EQ(coordinator_.list_devices_calls, 3);
  EXPECT_EQ(coordinator_.list_jobs_calls, 3);
  EXPECT_EQ(now_ - kNow, absl::Seconds(5));
  for (absl::Duration sleep : sleeps_) EXPECT_LE(sleep, absl::Milliseconds(100));
  const std::string out = out_.str();
  // Cursor hidden and screen cleared once; each frame from the top-left corner, each line erasing
  // what the last frame left of it, and the rest of the screen erased after it; cursor back at the end.
  EXPECT_THAT(out, StartsWith("\033[?25l\033[2J\033[Hfitrun top  2023-11-14 22:13:20 UTC  devices: 1"));
  EXPECT_EQ(Count(out, "\033[H"), 3);
  EXPECT_EQ(Count(out, "\033[J"), 3);
  EXPECT_EQ(Count(out, "\033[2J"), 1);
  EXPECT_THAT(out, HasSubstr("\033[Hfitrun top  2023-11-14 22:13:24 UTC"));
  EXPECT_THAT(out, HasSubstr("JOB\033[K\ncpu:0 "));
  EXPECT_EQ(Count(out, "\n"), Count(out, "\033[K\n"));
  EXPECT_THAT(out, ::testing::EndsWith("\033[J\033[?25h"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(TopCommandTest, TheFrameFitsTheTerminalLeavingItsLastRowFree) {
  env_.out_is_terminal = true;
  env_.terminal_size = [] { return TerminalSize{30, 6}; };
  InterruptAfter(absl::Seconds(1));
  EXPECT_EQ(RunTop(env_, {}), kExitOk);
  const std::string out = out_.str();
  EXPECT_EQ(Count(out, "\n"), 5);
  EXPECT_THAT(out, HasSubstr("\033[K\n... 7 more lines (a taller te…\033[K\n\033[J"));
}

TEST_F(TopCommandTest, KeepsRefreshingThroughAnUnreachableCoordinator) {
  env_.out_is_terminal = true;
  coordinator_.devices_reply = absl::UnavailableError("failed to connect to all addresses");
  InterruptAfter(absl::Seconds(3));
  EXPECT_EQ(RunTop(env_, {absl::Seconds(1), false}), kExitOk);
  EXPECT_EQ(coordinator_.list_devices_calls, 3);
  EXPECT_THAT(out_.str(), HasSubstr("coordinator unreachable: UNAVAILABLE: failed to connect to all addresses"));
  EXPECT_THAT(out_.str(), ::testing::EndsWith("\033[?25h"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(TopCommandTest, ARefusalEndsItWithTheCursorRestored) {
  env_.out_is_terminal = true;
  coordinator_.list_reply = absl::PermissionDeniedError("token: not an admin");
  InterruptAfter(absl::Seconds(60));
  EXPECT_EQ(RunTop(env_, {}), kExitRejected);
  EXPECT_EQ(coordinator_.list_jobs_calls, 1);
  EXPECT_THAT(out_.str(), ::testing::EndsWith("\033[?25h"));
  EXPECT_EQ(err_.str(), "error: PERMISSION_DENIED: token: not an admin\n");
}

TEST_F(TopCommandTest, OncePrintsTheErrorAndItsExitCode) {
  env_.out_is_terminal = false;
  coordinator_.devices_reply = absl::UnavailableError("failed to connect to all addresses");
  EXPECT_EQ(RunTop(env_, {}), kExitTransport);
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(), "error: UNAVAILABLE: failed to connect to all addresses\n");
}

TEST_F(TopCommandTest, RejectsAnIntervalThatIsNotPositive) {
  EXPECT_EQ(RunTop(env_, {absl::ZeroDuration(), false}), kExitUsage);
  EXPECT_EQ(err_.str(), "error: --interval: must be positive (got 0)\n");
  EXPECT_EQ(coordinator_.list_devices_calls, 0);
}

TEST(ExitCodeForRpcErrorTest, TransportVersusRefused) {
  EXPECT_EQ(ExitCodeForRpcError(absl::OkStatus()), kExitOk);
  EXPECT_EQ(ExitCodeForRpcError(absl::UnavailableError("")), kExitTransport);
  EXPECT_EQ(ExitCodeForRpcError(absl::DeadlineExceededError("")), kExitTransport);
  EXPECT_EQ(ExitCodeForRpcError(absl::InvalidArgumentError("")), kExitRejected);
  EXPECT_EQ(ExitCodeForRpcError(absl::FailedPreconditionError("")), kExitRejected);
}

}  // namespace
}  // namespace fitrun::client
