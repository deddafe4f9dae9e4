#include "client/render.h"
#include "client/watch_state.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

RenderContext Context() { return {kNow, absl::UTCTimeZone()}; }

void SetTime(absl::Time time, google::protobuf::Timestamp* timestamp) {
  timestamp->set_seconds(absl::ToUnixSeconds(time));
}

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("j-1");
  job.mutable_spec()->set_name("mnist-mlp");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempts(1);
  job.mutable_plan()->add_device_ids("cpu:0");
  job.mutable_plan()->add_device_ids("cpu:1");
  job.mutable_plan()->set_per_device_batch(64);
  job.mutable_plan()->set_grad_accum_steps(1);
  job.mutable_plan()->set_learning_rate(0.1);
  job.mutable_last_progress()->set_step(120);
  job.mutable_last_progress()->set_total_steps(1875);
  job.mutable_last_progress()->set_epoch(1);
  job.mutable_last_progress()->set_loss(0.51234);
  SetTime(kNow - absl::Minutes(3), job.mutable_created_at());
  SetTime(kNow - absl::Minutes(2), job.mutable_started_at());
  return job;
}

TEST(ToJsonTest, PrintsEveryFieldInCanonicalJson) {
  v1::Plan plan;
  plan.add_device_ids("cpu:0");
  absl::StatusOr<std::string> json = ToJson(plan);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"deviceIds\": [\n  \"cpu:0\"\n ]"));
  // Zero values are printed, so scripts can rely on the keys.
  EXPECT_THAT(*json, HasSubstr("\"perDeviceBatch\": \"0\""));
  EXPECT_THAT(*json, HasSubstr("\"gradAccumSteps\": 0"));
  EXPECT_EQ(json->back(), '\n');
}

TEST(ToJsonTest, EnumsAsNames) {
  v1::Job job;
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  absl::StatusOr<std::string> json = ToJson(job);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"state\": \"JOB_STATE_SUCCEEDED\""));
}

TEST(RenderJobTest, ShowsStatePlanAndProgress) {
  const std::string text = RenderJob(RunningJob(), Context());
  EXPECT_EQ(text,
            "id:       j-1\n"
            "name:     mnist-mlp\n"
            "state:    RUNNING\n"
            "created:  2023-11-14 22:10:20 UTC (3m00s ago)\n"
            "started:  2023-11-14 22:11:20 UTC (2m00s ago)\n"
            "plan:     2 devices (cpu:0, cpu:1), per-device batch 64, grad accum 1, lr 0.1\n"
            "progress: step 120/1875, epoch 1, loss 0.5123\n");
}

TEST(RenderJobTest, DrawsTheLossCurveBelowTheProgress) {
  const std::string text = RenderJob(RunningJob(), Context(), {{1, 2.3}, {60, 0.9}, {120, 0.51234}});
  EXPECT_THAT(text, HasSubstr("progress:   step 120/1875, epoch 1, loss 0.5123\n"
                              "loss curve: 2.3000 █▃▁ 0.5123  (steps 1-120; min 0.5123 at step 120)\n"));
  // One point says nothing the progress line does not.
  EXPECT_THAT(RenderJob(RunningJob(), Context(), {{120, 0.51234}}), Not(HasSubstr("loss curve")));
}

TEST(RenderJobTest, ShowsAttemptsFailureAndResult) {
  v1::Job failed = RunningJob();
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.set_attempts(3);
  failed.set_failure_reason("rank 1 out of memory 3 times");
  const std::string failed_text = RenderJob(failed, Context());
  EXPECT_THAT(failed_text, HasSubstr("state:    FAILED (attempt 3)\n"));
  EXPECT_THAT(failed_text, HasSubstr("failure:  rank 1 out of memory 3 times\n"));
  EXPECT_THAT(failed_text, Not(HasSubstr("result")));

  v1::Job unnamed = RunningJob();
  unnamed.mutable_spec()->clear_name();
  EXPECT_THAT(RenderJob(unnamed, Context()), Not(HasSubstr("name:")));

  v1::Job succeeded = RunningJob();
  succeeded.set_state(v1::JOB_STATE_SUCCEEDED);
  succeeded.mutable_result()->set_test_accuracy(0.8412);
  succeeded.mutable_result()->set_has_test_accuracy(true);
  succeeded.mutable_result()->set_final_loss(0.3);
  succeeded.mutable_result()->set_steps(1875);
  succeeded.mutable_result()->set_train_seconds(133);
  EXPECT_THAT(RenderJob(succeeded, Context()),
              HasSubstr("result:   test accuracy 0.8412, final loss 0.3000, 1875 steps, train "
                        "time 2m13s\n"));
}

TEST(RenderJobTest, ShowsRecoveryAgainstItsLimitsAndWhatEachOutOfMemoryMeasured) {
  v1::Job job = RunningJob();
  job.mutable_spec()->mutable_fault_tolerance()->set_max_restarts(3);
  job.mutable_spec()->mutable_fault_tolerance()->set_max_oom_retries(2);
  job.set_restarts(1);
  job.set_oom_replans(1);
  v1::OutOfMemory* oom = job.add_oom_history();
  oom->set_rank(1);
  oom->set_step(120);
  oom->set_per_device_batch(128);
  oom->set_requested_bytes(64LL << 20);
  oom->set_live_bytes(1536LL << 20);
  oom->set_cap_bytes(2LL << 30);
  const std::string text = RenderJob(job, Context());
  EXPECT_THAT(text, HasSubstr("1 of 3 restart(s), 1 of 2 out-of-memory re-plan(s)"));
  EXPECT_THAT(text, HasSubstr("rank 1 at step 120, per-device batch 128: asked for 64.0 MiB with 1.5 GiB in use of 2.0 GiB"));
  EXPECT_THAT(RenderJob(RunningJob(), Context()), Not(HasSubstr("recovery")));
  // One where the attempt's host memory ran out says so, not the device's figures.
  v1::OutOfMemory* host = job.add_oom_history();
  host->set_rank(0);
  host->set_per_device_batch(64);
  host->set_host_limit_bytes(5LL << 30);
  EXPECT_THAT(RenderJob(job, Context()), HasSubstr("rank 0, per-device batch 64: the attempt's host memory (limit 5.0 GiB)"));
}

TEST(RenderJobTableTest, OneRowPerJob) {
  v1::ListJobsResponse response;
  *response.add_jobs() = RunningJob();
  v1::Job* queued = response.add_jobs();
  queued->set_id("j-10");
  queued->mutable_spec()->set_name("cnn");
  queued->set_state(v1::JOB_STATE_QUEUED);
  SetTime(kNow - absl::Seconds(5), queued->mutable_created_at());

  EXPECT_EQ(RenderJobTable(response, Context()),
            "ID    NAME       STATE    DEVICES      STEP    LOSS    AGE\n"
            "j-1   mnist-mlp  RUNNING        2  120/1875  0.5123  3m00s\n"
            "j-10  cnn        QUEUED         -         -       -     5s\n");
}

TEST(RenderJobTableTest, SaysSoWhenThereAreNoJobs) {
  EXPECT_EQ(RenderJobTable(v1::ListJobsResponse(), Context()), "no jobs\n");
}

TEST(RenderPlanTest, ShowsChoicesBreakdownAndReasons) {
  v1::PlanJobResponse response;
  response.mutable_spec()->set_global_batch_size(256);
  v1::Plan* plan = response.mutable_plan();
  plan->add_device_ids("cpu:0");
  plan->add_device_ids("cpu:1");
  plan->set_per_device_batch(64);
  plan->set_grad_accum_steps(2);
  plan->set_learning_rate(0.0025);
  plan->set_steps_per_epoch(235);
  plan->set_total_steps(470);
  v1::MemoryBreakdown* predicted = plan->mutable_predicted();
  predicted->set_weights_bytes(int64_t{1} << 20);
  predicted->set_gradients_bytes(int64_t{1} << 20);
  predicted->set_optimizer_state_bytes(int64_t{2} << 20);
  predicted->set_ddp_buckets_bytes(int64_t{25} << 20);
  predicted->set_activations_bytes(int64_t{300} << 20);
  predicted->set_workspace_bytes(int64_t{10} << 20);
  predicted->set_framework_overhead_bytes(int64_t{50} << 20);
  predicted->set_safety_margin_bytes(int64_t{3} << 19);
  predicted->set_total_bytes((int64_t{389} << 20) + (int64_t{3} << 19));
  plan->add_reasons("2 devices: every free device fits the minimum batch");
  plan->add_reasons("per-device batch 64: 128 would need 2.4 GiB of 2.0 GiB free");

  EXPECT_EQ(RenderPlan(response),
            "devices:           2 (cpu:0, cpu:1)\n"
            "per-device batch:  64\n"
            "grad accumulation: 2\n"
            "global batch:      256\n"
            "learning rate:     0.0025\n"
            "steps:             470 (235 per epoch)\n"
            "predicted peak:    390.5 MiB per device\n"
            "  weights               1.0 MiB\n"
            "  gradients             1.0 MiB\n"
            "  optimizer state       2.0 MiB\n"
            "  ddp buckets          25.0 MiB\n"
            "  activations         300.0 MiB\n"
            "  workspace            10.0 MiB\n"
            "  framework overhead   50.0 MiB\n"
            "  safety margin         1.5 MiB\n"
            "reasons:\n"
            "  2 devices: every free device fits the minimum batch\n"
            "  per-device batch 64: 128 would need 2.4 GiB of 2.0 GiB free\n");
}

TEST(RenderPlanTest, SaysWhenTheOptimizerStatesAreSharded) {
  v1::PlanJobResponse response;
  response.mutable_plan()->add_device_ids("cpu:0");
  response.mutable_plan()->add_device_ids("cpu:1");
  response.mutable_plan()->set_per_device_batch(1);
  response.mutable_plan()->set_grad_accum_steps(1);
  response.mutable_plan()->set_zero_stage(1);
  EXPECT_THAT(RenderPlan(response), HasSubstr("grad accumulation: 1\n"
                                              "optimizer states:  sharded over the 2 ranks (zero stage 1)\n"));
  EXPECT_THAT(DescribePlan(response.plan()), HasSubstr("grad accum 1, lr 0, optimizer states sharded"));
  response.mutable_plan()->set_zero_stage(0);
  EXPECT_THAT(RenderPlan(response), Not(HasSubstr("optimizer states:")));
}

TEST(RenderPlanTest, SaysWhenTheActivationsAreRecomputed) {
  v1::PlanJobResponse response;
  response.mutable_plan()->add_device_ids("cpu:0");
  response.mutable_plan()->set_per_device_batch(8);
  response.mutable_plan()->set_grad_accum_steps(1);
  EXPECT_THAT(RenderPlan(response), Not(HasSubstr("activations:")));
  response.mutable_plan()->set_activation_checkpointing(true);
  EXPECT_THAT(RenderPlan(response), HasSubstr("activations:       recomputed in backward (checkpointing)\n"));
  EXPECT_THAT(DescribePlan(response.plan()), HasSubstr("grad accum 1, lr 0, activations recomputed"));
}

TEST(RenderPlanTest, ComputesTheGlobalBatchWhenTheSpecOmitsIt) {
  v1::PlanJobResponse response;
  response.mutable_plan()->add_device_ids("cuda:0");
  response.mutable_plan()->set_per_device_batch(32);
  response.mutable_plan()->set_grad_accum_steps(4);
  EXPECT_THAT(RenderPlan(response), HasSubstr("global batch:      128\n"));
}

TEST(RenderPlanTest, ShowsTheNodesOfAClusterPlan) {
  v1::PlanJobResponse response;
  for (const char* id : {"n1/cpu:0", "n1/cpu:1", "n2/cpu:0", "n2/cpu:1"}) response.mutable_plan()->add_device_ids(id);
  response.mutable_plan()->add_nodes("n1");
  response.mutable_plan()->add_nodes("n2");
  response.mutable_plan()->set_devices_per_node(2);
  response.mutable_plan()->set_per_device_batch(64);
  response.mutable_plan()->set_grad_accum_steps(1);
  EXPECT_THAT(RenderPlan(response), HasSubstr("nodes:             2 x 2 devices (n1, n2)\n"));
}

TEST(RenderJobTest, ShowsTheClusterSchedulersWordOnAWaitingAllocation) {
  v1::Job job;
  job.set_id("j1");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_allocation_status("PENDING (Resources)");
  EXPECT_THAT(RenderJob(job, Context()), HasSubstr("allocation: PENDING (Resources)"));
}

TEST(RenderDeviceTableTest, ShowsMemoryAndTheHoldingJob) {
  v1::ListDevicesResponse response;
  v1::Device* busy = response.add_devices();
  busy->set_id("cpu:0");
  busy->set_kind(v1::DEVICE_KIND_CPU);
  busy->set_name("virtual cpu");
  busy->set_total_bytes(int64_t{2} << 30);
  busy->set_free_bytes(int64_t{3} << 29);
  busy->set_used_bytes(int64_t{1} << 29);
  busy->set_job_id("j-1");
  busy->set_rank(0);
  v1::Device* idle = response.add_devices();
  idle->set_id("cuda:1");
  idle->set_kind(v1::DEVICE_KIND_CUDA);
  idle->set_name("NVIDIA A100-SXM4-80GB");
  idle->set_total_bytes(int64_t{80} << 30);
  // No used_bytes: derived from total - free.
  idle->set_free_bytes(int64_t{60} << 30);

  EXPECT_EQ(RenderDeviceTable(response),
            "ID      KIND  NAME                      TOTAL      FREE  USED                         "
            "JOB\n"
            "cpu:0   cpu   virtual cpu             2.0 GiB   1.5 GiB  [#####...............]  "
            "25%  j-1 (rank 0)\n"
            "cuda:1  cuda  NVIDIA A100-SXM4-80GB  80.0 GiB  60.0 GiB  [#####...............]  "
            "25%  -\n");
}

TEST(RenderDeviceTableTest, SaysSoWhenThereAreNoDevices) {
  EXPECT_EQ(RenderDeviceTable(v1::ListDevicesResponse()), "no devices\n");
}

TEST(RenderJobTest, ShowsEveryAttemptWithHowEachRankExited) {
  v1::Job job;
  job.set_id("j-5");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempts(2);
  v1::AttemptRecord* first = job.add_attempt_history();
  first->set_attempt(1);
  first->add_device_ids("cpu:0");
  first->add_device_ids("cpu:1");
  first->set_per_device_batch(128);
  first->set_grad_accum_steps(1);
  first->set_outcome("rank 1 exited with code 3 (attempt 1)");
  v1::RankOutcome* r0 = first->add_ranks();
  r0->set_rank(0);
  r0->set_exited(true);
  r0->set_exit_code(-1);
  r0->set_signal(15);
  v1::RankOutcome* r1 = first->add_ranks();
  r1->set_rank(1);
  r1->set_exited(true);
  r1->set_exit_code(3);
  v1::AttemptRecord* second = job.add_attempt_history();
  second->set_attempt(2);
  second->add_device_ids("cpu:0");
  second->set_per_device_batch(64);
  second->set_grad_accum_steps(4);
  v1::RankOutcome* running = second->add_ranks();
  running->set_pid(4242);
  const std::string text = RenderJob(job, Context());
  EXPECT_THAT(text, HasSubstr("attempt 1: 2 device(s), per-device batch 128 x 1: rank 1 exited with code 3 (attempt 1) "
                              "[ranks: 0 signal 15, 1 exit 3]"));
  EXPECT_THAT(text, HasSubstr("attempt 2: 1 device(s), per-device batch 64 x 4: running [ranks: 0 running (pid 4242)]"));
}

TEST(RenderJobTest, AFinishedAttemptShowsItsPeakAgainstThePrediction) {
  v1::Job job;
  job.set_id("j-6");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  v1::AttemptRecord* attempt = job.add_attempt_history();
  attempt->set_attempt(1);
  attempt->add_device_ids("cpu:0");
  attempt->set_per_device_batch(512);
  attempt->set_grad_accum_steps(1);
  attempt->set_outcome("succeeded");
  attempt->set_predicted_peak_bytes(20 << 20);
  attempt->set_measured_peak_bytes(19 << 20);
  EXPECT_THAT(RenderJob(job, Context()),
              HasSubstr("attempt 1: 1 device(s), per-device batch 512 x 1: succeeded; memory: peaked at 19.0 MiB of "
                        "20.0 MiB predicted (95%)"));
}

TEST(RenderOutcomeTest, ModelsWithoutAccuracyShowNoAccuracy) {
  v1::Job job;
  job.set_id("j-2");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_result()->set_final_loss(1.5);
  job.mutable_result()->set_steps(20);
  job.mutable_result()->set_train_seconds(3);
  EXPECT_THAT(RenderOutcome(job), ::testing::Not(::testing::HasSubstr("accuracy")));
  EXPECT_THAT(RenderOutcome(job), ::testing::HasSubstr("final loss: 1.5000"));
}

TEST(RenderOutcomeTest, SucceededPrintsTheResult) {
  v1::Job job;
  job.set_id("j-1");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_result()->set_test_accuracy(0.84123);
  job.mutable_result()->set_has_test_accuracy(true);
  job.mutable_result()->set_final_loss(0.4);
  job.mutable_result()->set_steps(1875);
  job.mutable_result()->set_train_seconds(42.25);
  EXPECT_EQ(RenderOutcome(job),
            "job j-1 SUCCEEDED\n"
            "test accuracy: 0.8412\n"
            "final loss:    0.4000\n"
            "steps:         1875\n"
            "train time:    42.2s\n");
}

TEST(RenderOutcomeTest, SucceededPrintsTheWorkloadsOwnFigures) {
  v1::Job job;
  job.set_id("j-3");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_result()->set_test_accuracy(0.912);
  job.mutable_result()->set_has_test_accuracy(true);
  (*job.mutable_result()->mutable_metrics())["ndcg@10"] = 0.61234;
  (*job.mutable_result()->mutable_metrics())["hr@10"] = 0.912;
  job.mutable_result()->set_final_loss(0.4);
  job.mutable_result()->set_steps(100);
  job.mutable_result()->set_train_seconds(12);
  EXPECT_EQ(RenderOutcome(job),
            "job j-3 SUCCEEDED\n"
            "test accuracy: 0.9120\n"
            "hr@10:         0.912\n"
            "ndcg@10:       0.6123\n"
            "final loss:    0.4000\n"
            "steps:         100\n"
            "train time:    12.0s\n");
  EXPECT_THAT(RenderJob(job, {absl::Now(), absl::UTCTimeZone()}),
              ::testing::HasSubstr("result: test accuracy 0.9120, hr@10 0.912, ndcg@10 0.6123, final loss 0.4000"));
}

TEST(RenderOutcomeTest, AScriptThatReportedNothingHasNoStepsOrLossOnlyItsRunTime) {
  v1::Job job;
  job.set_id("j-4");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_spec()->mutable_script()->add_command("/usr/bin/python3");
  job.mutable_result()->set_train_seconds(4.1);
  EXPECT_EQ(RenderOutcome(job), "job j-4 SUCCEEDED\nrun time: 4.1s\n");
}

TEST(RenderOutcomeTest, OtherStatesPrintWhy) {
  v1::Job job;
  job.set_id("j-2");
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_attempts(3);
  job.set_failure_reason("rank 1 exited with code 3");
  EXPECT_EQ(RenderOutcome(job), "job j-2 FAILED after 3 attempts: rank 1 exited with code 3\n");

  job.set_state(v1::JOB_STATE_CANCELLED);
  job.set_attempts(1);
  job.set_failure_reason("");
  EXPECT_EQ(RenderOutcome(job), "job j-2 CANCELLED\n");
}

}  // namespace
}  // namespace fitrun::client
