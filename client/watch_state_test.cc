#include "client/watch_state.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kStart = absl::FromUnixSeconds(1700000000);

void SetTime(absl::Time time, v1::JobEvent* event) {
  const int64_t nanos = absl::ToUnixNanos(time);
  event->mutable_time()->set_seconds(nanos / 1000000000);
  event->mutable_time()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

v1::JobEvent ProgressEvent(int64_t sequence, absl::Time time, int32_t rank, int64_t step,
                           double loss = 0.5, double samples_per_second = 100,
                           int64_t total_steps = 1000, int32_t epoch = 1) {
  v1::JobEvent event;
  event.set_job_id("j-1");
  event.set_sequence(sequence);
  SetTime(time, &event);
  v1::Progress* progress = event.mutable_progress();
  progress->set_rank(rank);
  progress->set_step(step);
  progress->set_total_steps(total_steps);
  progress->set_epoch(epoch);
  progress->set_loss(loss);
  progress->set_samples_per_second(samples_per_second);
  return event;
}

v1::JobEvent PlanEvent(int64_t sequence, int32_t attempt, std::vector<std::string> devices) {
  v1::JobEvent event;
  event.set_sequence(sequence);
  SetTime(kStart, &event);
  v1::PlanChosen* chosen = event.mutable_plan_chosen();
  chosen->set_attempt(attempt);
  v1::Plan* plan = chosen->mutable_plan();
  for (const std::string& device : devices) plan->add_device_ids(device);
  plan->set_per_device_batch(64);
  plan->set_grad_accum_steps(2);
  plan->set_learning_rate(0.002);
  plan->set_total_steps(1000);
  plan->mutable_predicted()->set_total_bytes(int64_t{412} << 20);
  return event;
}

v1::JobEvent StateEvent(int64_t sequence, v1::JobState from, v1::JobState to,
                        const std::string& reason = "") {
  v1::JobEvent event;
  event.set_sequence(sequence);
  SetTime(kStart, &event);
  event.mutable_state_changed()->set_from(from);
  event.mutable_state_changed()->set_to(to);
  event.mutable_state_changed()->set_reason(reason);
  return event;
}

TEST(WatchStateTest, AggregatesOverRanks) {
  WatchState state;
  state.Apply(PlanEvent(1, 1, {"cpu:0", "cpu:1"}), kStart);
  // Rank 1 is behind: the job is only as far as its slowest rank.
  state.Apply(ProgressEvent(2, kStart, /*rank=*/0, /*step=*/120, /*loss=*/0.5123, 800), kStart);
  state.Apply(ProgressEvent(3, kStart, /*rank=*/1, /*step=*/118, /*loss=*/9.0, 750), kStart);

  const AggregateProgress progress = state.progress();
  EXPECT_EQ(progress.step, 118);
  EXPECT_EQ(progress.total_steps, 1000);
  EXPECT_TRUE(progress.has_loss);
  EXPECT_DOUBLE_EQ(progress.loss, 0.5123);  // rank 0's, not rank 1's
  EXPECT_DOUBLE_EQ(progress.samples_per_second, 1550);
  EXPECT_EQ(progress.ranks_reporting, 2);
  EXPECT_EQ(progress.world_size, 2);
  EXPECT_FALSE(progress.eta.has_value());
  EXPECT_EQ(state.ProgressLine(),
            "step 118/1000 (11.8%)  epoch 1  loss 0.5123  1550 samples/s  ETA --");
}

TEST(WatchStateTest, EtaFollowsTheStepRate) {
  WatchState state;
  state.Apply(PlanEvent(1, 1, {"cpu:0", "cpu:1"}), kStart);
  state.Apply(ProgressEvent(2, kStart, 0, 100), kStart);
  state.Apply(ProgressEvent(3, kStart, 1, 100), kStart);
  state.Apply(ProgressEvent(4, kStart + absl::Seconds(10), 0, 200), kStart);
  // Until rank 1 catches up the aggregate step has not moved.
  EXPECT_FALSE(state.progress().eta.has_value());
  state.Apply(ProgressEvent(5, kStart + absl::Seconds(10), 1, 200), kStart);

  // 100 steps in 10 s, 800 to go.
  ASSERT_TRUE(state.progress().eta.has_value());
  EXPECT_EQ(*state.progress().eta, absl::Seconds(80));
  EXPECT_EQ(state.ProgressLine(),
            "step 200/1000 (20.0%)  epoch 1  loss 0.5000  200 samples/s  ETA 1m20s");
}

TEST(WatchStateTest, EtaUsesOnlyTheRecentWindow) {
  WatchState state;
  // Slow at first (1 step/s), then fast (10 steps/s): the ETA should reflect the fast rate.
  state.Apply(ProgressEvent(1, kStart, 0, 0, 0.5, 100, 1300), kStart);
  state.Apply(ProgressEvent(2, kStart + absl::Seconds(100), 0, 100, 0.5, 100, 1300), kStart);
  state.Apply(ProgressEvent(3, kStart + absl::Seconds(110), 0, 200, 0.5, 100, 1300), kStart);
  state.Apply(ProgressEvent(4, kStart + absl::Seconds(120), 0, 300, 0.5, 100, 1300), kStart);
  ASSERT_TRUE(state.progress().eta.has_value());
  EXPECT_EQ(*state.progress().eta, absl::Seconds(100));
}

TEST(WatchStateTest, UsesReceiveTimeWhenEventsAreNotStamped) {
  WatchState state;
  v1::JobEvent first = ProgressEvent(1, kStart, 0, 10, 0.5, 100, 110);
  first.clear_time();
  v1::JobEvent second = ProgressEvent(2, kStart, 0, 60, 0.5, 100, 110);
  second.clear_time();
  state.Apply(first, kStart);
  state.Apply(second, kStart + absl::Seconds(5));
  ASSERT_TRUE(state.progress().eta.has_value());
  EXPECT_EQ(*state.progress().eta, absl::Seconds(5));
}

TEST(WatchStateTest, SaysWhenNotAllRanksHaveReported) {
  WatchState state;
  state.Apply(PlanEvent(1, 1, {"cpu:0", "cpu:1", "cpu:2"}), kStart);
  state.Apply(ProgressEvent(2, kStart, 0, 5), kStart);
  EXPECT_EQ(state.ProgressLine(),
            "step 5/1000 (0.5%)  epoch 1  loss 0.5000  100 samples/s  ETA --  (1/3 ranks)");
}

TEST(WatchStateTest, LossIsOmittedUntilRankZeroReports) {
  WatchState state;
  state.Apply(ProgressEvent(1, kStart, 1, 5, 0.5, 12.5, /*total_steps=*/0), kStart);
  EXPECT_FALSE(state.progress().has_loss);
  EXPECT_EQ(state.ProgressLine(), "step 5  epoch 1  12.5 samples/s  ETA --");
}

TEST(WatchStateTest, ShowsRankZerosOwnFigures) {
  WatchState state;
  state.Apply(PlanEvent(1, 1, {"cpu:0", "cpu:1"}), kStart);
  v1::JobEvent zero = ProgressEvent(2, kStart, /*rank=*/0, /*step=*/40, /*loss=*/2.25, 300);
  (*zero.mutable_progress()->mutable_metrics())["masked_accuracy"] = 0.1875;
  v1::JobEvent one = ProgressEvent(3, kStart, /*rank=*/1, /*step=*/40, /*loss=*/2.25, 300);
  (*one.mutable_progress()->mutable_metrics())["masked_accuracy"] = 0.5;
  state.Apply(zero, kStart);
  state.Apply(one, kStart);
  EXPECT_EQ(state.ProgressLine(), "step 40/1000 (4.0%)  epoch 1  loss 2.2500  masked_accuracy 0.1875  600 samples/s  ETA --");
}

TEST(WatchStateTest, NoProgressNoLine) {
  WatchState state;
  EXPECT_FALSE(state.has_progress());
  EXPECT_EQ(state.ProgressLine(), "");
}

TEST(WatchStateTest, RestartForgetsTheOldAttemptsProgress) {
  WatchState state;
  state.Apply(PlanEvent(1, 1, {"cpu:0", "cpu:1"}), kStart);
  state.Apply(ProgressEvent(2, kStart, 0, 300), kStart);
  state.Apply(ProgressEvent(3, kStart + absl::Seconds(3), 0, 330), kStart);
  EXPECT_TRUE(state.progress().eta.has_value());

  EXPECT_THAT(state.Apply(StateEvent(4, v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING,
                                     "rank 1 out of memory"),
                          kStart),
              ElementsAre("state: RUNNING -> RESTARTING (rank 1 out of memory)"));
  EXPECT_EQ(state.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_FALSE(state.has_progress());

  state.Apply(PlanEvent(5, 2, {"cpu:0", "cpu:1"}), kStart);
  state.Apply(ProgressEvent(6, kStart + absl::Seconds(10), 0, 200), kStart);
  state.Apply(ProgressEvent(7, kStart + absl::Seconds(10), 1, 200), kStart);
  EXPECT_EQ(state.progress().step, 200);
  EXPECT_FALSE(state.progress().eta.has_value());
}

TEST(WatchStateTest, StepGoingBackwardsResetsTheRate) {
  WatchState state;
  state.Apply(ProgressEvent(1, kStart, 0, 300), kStart);
  state.Apply(ProgressEvent(2, kStart + absl::Seconds(1), 0, 400), kStart);
  // Resumed from a checkpoint without a RESTARTING event in between (e.g. events missed).
  state.Apply(ProgressEvent(3, kStart + absl::Seconds(20), 0, 100), kStart);
  EXPECT_FALSE(state.progress().eta.has_value());
  state.Apply(ProgressEvent(4, kStart + absl::Seconds(30), 0, 200), kStart);
  ASSERT_TRUE(state.progress().eta.has_value());
  EXPECT_EQ(*state.progress().eta, absl::Seconds(80));
}

TEST(WatchStateTest, IgnoresEventsAlreadySeen) {
  WatchState state;
  state.Apply(ProgressEvent(1, kStart, 0, 10), kStart);
  state.Apply(ProgressEvent(2, kStart, 0, 20), kStart);
  // A resumed stream may start before the last event seen.
  EXPECT_THAT(state.Apply(StateEvent(2, v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING), kStart),
              IsEmpty());
  state.Apply(ProgressEvent(1, kStart, 0, 10), kStart);
  EXPECT_EQ(state.progress().step, 20);
  EXPECT_EQ(state.last_sequence(), 2);
}

TEST(WatchStateTest, DescribesStateChanges) {
  WatchState state;
  EXPECT_THAT(state.Apply(StateEvent(1, v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED), kStart),
              ElementsAre("state: QUEUED"));
  EXPECT_THAT(state.Apply(StateEvent(2, v1::JOB_STATE_QUEUED, v1::JOB_STATE_PLANNING), kStart),
              ElementsAre("state: QUEUED -> PLANNING"));
  EXPECT_EQ(state.state(), v1::JOB_STATE_PLANNING);
}

TEST(WatchStateTest, DescribesThePlan) {
  WatchState state;
  EXPECT_THAT(state.Apply(PlanEvent(1, 1, {"cpu:0", "cpu:1"}), kStart),
              ElementsAre("plan (attempt 1): 2 devices (cpu:0, cpu:1), per-device batch 64, "
                          "grad accum 2, lr 0.002, predicted peak 412.0 MiB"));
}

TEST(WatchStateTest, DescribesAnOutOfMemory) {
  v1::JobEvent event;
  event.set_sequence(1);
  v1::OutOfMemory* oom = event.mutable_oom();
  oom->set_rank(1);
  oom->set_step(120);
  oom->set_per_device_batch(256);
  oom->set_requested_bytes(int64_t{64} << 20);
  oom->set_live_bytes(int64_t{1946} << 20);
  oom->set_peak_bytes(int64_t{2000} << 20);
  oom->set_cap_bytes(int64_t{2} << 30);
  WatchState state;
  EXPECT_THAT(state.Apply(event, kStart),
              ElementsAre("rank 1: out of memory at step 120 (per-device batch 256): requested "
                          "64.0 MiB, live 1.9 GiB, peak 2.0 GiB, cap 2.0 GiB"));
}

TEST(WatchStateTest, DescribesCheckpointsLogsAndFinishedRanks) {
  WatchState state;
  v1::JobEvent checkpoint;
  checkpoint.set_sequence(1);
  checkpoint.mutable_checkpoint_saved()->set_step(500);
  checkpoint.mutable_checkpoint_saved()->set_path("/var/lib/fitrun/j-1/ckpt-500.pt");
  checkpoint.mutable_checkpoint_saved()->set_bytes(int64_t{3} << 19);
  EXPECT_THAT(state.Apply(checkpoint, kStart),
              ElementsAre("checkpoint: step 500 saved to /var/lib/fitrun/j-1/ckpt-500.pt (1.5 MiB)"));

  v1::JobEvent log;
  log.set_sequence(2);
  log.mutable_log()->set_rank(1);
  log.mutable_log()->set_text("loading data\nready\n");
  EXPECT_THAT(state.Apply(log, kStart), ElementsAre("rank 1: loading data", "rank 1: ready"));

  v1::JobEvent finished;
  finished.set_sequence(3);
  finished.mutable_rank_finished()->set_rank(0);
  finished.mutable_rank_finished()->set_steps(1875);
  finished.mutable_rank_finished()->set_final_loss(0.31234);
  finished.mutable_rank_finished()->set_has_test_accuracy(true);
  finished.mutable_rank_finished()->set_test_accuracy(0.8412);
  EXPECT_THAT(state.Apply(finished, kStart),
              ElementsAre("rank 0 finished: 1875 steps, loss 0.3123, test accuracy 0.8412"));

  v1::JobEvent figures;
  figures.set_sequence(4);
  figures.mutable_rank_finished()->set_rank(0);
  figures.mutable_rank_finished()->set_steps(100);
  figures.mutable_rank_finished()->set_final_loss(1.5);
  (*figures.mutable_rank_finished()->mutable_metrics())["test_loss"] = 1.61;
  EXPECT_THAT(state.Apply(figures, kStart), ElementsAre("rank 0 finished: 100 steps, loss 1.5000, test_loss 1.61"));

  // A script that reported no progress: no made-up zero steps and loss.
  v1::JobEvent quiet;
  quiet.set_sequence(5);
  quiet.mutable_rank_finished()->set_rank(1);
  EXPECT_THAT(state.Apply(quiet, kStart), ElementsAre("rank 1 finished"));

  // The coordinator's own lines carry no rank.
  v1::JobEvent planning;
  planning.set_sequence(6);
  planning.mutable_log()->set_rank(-1);
  planning.mutable_log()->set_text("planning: measuring the peak at per-device batch 16 before launch");
  EXPECT_THAT(state.Apply(planning, kStart),
              ElementsAre("fitrund: planning: measuring the peak at per-device batch 16 before launch"));
}

TEST(WatchStateTest, SaysHowLongACheckpointTookAndWhenOneFailed) {
  WatchState state;
  v1::JobEvent saved;
  saved.set_sequence(1);
  saved.mutable_checkpoint_saved()->set_step(1000);
  saved.mutable_checkpoint_saved()->set_path("/var/lib/fitrun/j-1/ckpt-1000.pt");
  saved.mutable_checkpoint_saved()->set_bytes(int64_t{3} << 19);
  saved.mutable_checkpoint_saved()->set_seconds(0.134);
  EXPECT_THAT(state.Apply(saved, kStart),
              ElementsAre("checkpoint: step 1000 saved to /var/lib/fitrun/j-1/ckpt-1000.pt (1.5 MiB in 0.13s)"));

  v1::JobEvent failed;
  failed.set_sequence(2);
  failed.mutable_checkpoint_failed()->set_rank(0);
  failed.mutable_checkpoint_failed()->set_step(1500);
  failed.mutable_checkpoint_failed()->set_error("cannot write /var/lib/fitrun/j-1/ckpt-1500.pt: No space left on device");
  EXPECT_THAT(state.Apply(failed, kStart),
              ElementsAre("checkpoint FAILED: rank 0 could not save step 1500: cannot write "
                          "/var/lib/fitrun/j-1/ckpt-1500.pt: No space left on device (training goes on; a restart "
                          "would resume from the previous checkpoint)"));

  // A multi-line error keeps its first line on the event's line and the rest below it.
  v1::JobEvent traced;
  traced.set_sequence(3);
  traced.mutable_checkpoint_failed()->set_rank(0);
  traced.mutable_checkpoint_failed()->set_step(2000);
  traced.mutable_checkpoint_failed()->set_error("torch::save failed\nfile exists\n");
  EXPECT_THAT(state.Apply(traced, kStart),
              ElementsAre("checkpoint FAILED: rank 0 could not save step 2000: torch::save failed (training goes "
                          "on; a restart would resume from the previous checkpoint)",
                          "  | file exists"));
}

TEST(WatchStateTest, DescribesAHostMemoryOomWithTheLimitAndWhatRaisesIt) {
  WatchState state;
  v1::JobEvent oom;
  oom.set_sequence(1);
  oom.mutable_host_memory_oom()->set_rank(1);
  oom.mutable_host_memory_oom()->set_attempt(2);
  oom.mutable_host_memory_oom()->set_limit_bytes(int64_t{5} << 30);
  oom.mutable_host_memory_oom()->set_peak_bytes(int64_t{5} << 30);
  oom.mutable_host_memory_oom()->set_per_device_batch(64);
  EXPECT_THAT(state.Apply(oom, kStart),
              ElementsAre("host memory: the kernel's OOM killer stopped a process of attempt 2 (seen as rank 1 "
                          "exited): its ranks' limit is 5.0 GiB, peak 5.0 GiB (per-device batch 64; "
                          "spec.resources.host_memory raises it)"));
}

TEST(WatchStateTest, DescribesRankExits) {
  WatchState state;
  v1::JobEvent clean;
  clean.set_sequence(1);
  clean.mutable_rank_exited()->set_rank(0);
  clean.mutable_rank_exited()->set_log_tail("bye\n");
  EXPECT_THAT(state.Apply(clean, kStart), ElementsAre("rank 0 exited cleanly"));

  v1::JobEvent failed;
  failed.set_sequence(2);
  failed.mutable_rank_exited()->set_rank(1);
  failed.mutable_rank_exited()->set_exit_code(3);
  failed.mutable_rank_exited()->set_log_tail("Traceback\nboom\n");
  EXPECT_THAT(state.Apply(failed, kStart),
              ElementsAre("rank 1 exited with code 3", "  | Traceback", "  | boom"));

  v1::JobEvent killed;
  killed.set_sequence(3);
  killed.mutable_rank_exited()->set_rank(2);
  killed.mutable_rank_exited()->set_exit_code(-1);
  killed.mutable_rank_exited()->set_signal(9);
  EXPECT_THAT(state.Apply(killed, kStart), ElementsAre("rank 2 killed by signal 9"));
}

TEST(WatchStateTest, MissedEventsMoveTheResumePoint) {
  WatchState state;
  state.Apply(ProgressEvent(4, kStart, 0, 10), kStart);
  v1::JobEvent missed;
  missed.mutable_missed()->set_first_sequence(5);
  missed.mutable_missed()->set_last_sequence(40);
  EXPECT_THAT(state.Apply(missed, kStart),
              ElementsAre("missed events 5..40: this watcher fell behind the job (progress may "
                          "jump)"));
  EXPECT_EQ(state.last_sequence(), 40);
}

}  // namespace
}  // namespace fitrun::client
