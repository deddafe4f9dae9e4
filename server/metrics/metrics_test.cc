// The catalog as Prometheus reads it: the event-driven series (PrometheusMetrics) and the ones read
// when scraped (LiveMetrics), serialized in the text format.
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/live_metrics.h"
#include "server/metrics/prometheus_metrics.h"

namespace fitrun::server {
namespace {

std::string Text(const prometheus::Collectable& collectable) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, collectable.Collect());
  return out.str();
}

TEST(PrometheusMetricsTest, JobEndsCheckpointsAndBuildInfo) {
  prometheus::Registry registry;
  PrometheusMetrics metrics(registry, "v1", absl::FromUnixSeconds(1700000000));
  // Every final state's histograms exist before any job ends.
  std::string text = Text(registry);
  for (const char* state : {"succeeded", "failed", "cancelled"}) {
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("fitrun_job_queue_wait_seconds_count{state=\"", state, "\"} 0")));
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("fitrun_job_duration_seconds_count{state=\"", state, "\"} 0")));
  }
  EXPECT_TRUE(absl::StrContains(text, "fitrun_build_info{version=\"v1\"} 1"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_start_time_seconds 1700000000"));

  metrics.JobEnded(fitrun::v1::JOB_STATE_SUCCEEDED, absl::Milliseconds(300), absl::Seconds(42));
  metrics.JobEnded(fitrun::v1::JOB_STATE_CANCELLED, absl::Seconds(20), absl::Seconds(20));
  metrics.CheckpointSaved(absl::Milliseconds(80));
  metrics.CheckpointSaved(absl::Milliseconds(120));
  metrics.CheckpointFailed();
  metrics.TrainingProgress(7);
  metrics.MemoryPredictionObserved(0.97);
  text = Text(registry);
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_queue_wait_seconds_count{state=\"succeeded\"} 1"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_queue_wait_seconds_bucket{state=\"succeeded\",le=\"0.25\"} 0"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_queue_wait_seconds_bucket{state=\"succeeded\",le=\"0.5\"} 1"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_duration_seconds_sum{state=\"succeeded\"} 42"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_duration_seconds_count{state=\"cancelled\"} 1"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_duration_seconds_count{state=\"failed\"} 0"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_checkpoint_saves_total 2"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_checkpoint_failures_total 1"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_checkpoint_save_seconds_sum 0.2"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_training_steps_total 7"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_memory_prediction_ratio_bucket{le=\"0.97\"} 1"));
}

JobManager::RankView Rank(int rank, const std::string& device, int64_t step, double loss, double samples,
                          double exposed) {
  JobManager::RankView view;
  view.rank = rank;
  view.device_id = device;
  view.planned_bytes = 100 << 20;
  view.peak_bytes = 90 << 20;
  view.last_progress.set_step(step);
  view.last_progress.set_loss(loss);
  view.last_progress.set_samples_per_second(samples);
  view.last_progress.set_step_seconds(0.05);
  view.last_progress.set_exposed_communication_share(exposed);
  return view;
}

TEST(LiveMetricsTest, DevicesAndRunningJobsAsTheyAreNow) {
  fitrun::v1::Device busy;
  busy.set_id("cuda:0");
  busy.set_total_bytes(24LL << 30);
  busy.set_free_bytes(20LL << 30);
  busy.set_job_id("j1");
  busy.set_rank(1);
  busy.set_planned_bytes(100 << 20);
  busy.set_peak_bytes(90 << 20);
  fitrun::v1::Device idle;
  idle.set_id("cuda:1");
  idle.set_total_bytes(24LL << 30);
  idle.set_free_bytes(24LL << 30);
  JobManager::RunningJob job;
  job.job.set_id("j1");
  job.job.set_owner("ada");
  job.job.mutable_spec()->set_name("gpt2 \"small\"");
  job.job.mutable_plan()->set_per_device_batch(16);
  job.job.mutable_plan()->set_grad_accum_steps(4);
  job.job.mutable_plan()->set_total_steps(500);
  job.ranks = {Rank(0, "cuda:1", 12, 2.5, 300, 0.1), Rank(1, "cuda:0", 12, 2.5, 310, 0.3)};
  JobManager::RunningJob starting;  // launched, no report yet: zeros, not gaps
  starting.job.set_id("j2");
  starting.ranks = {JobManager::RankView{0, "cpu:0", 0, 0, {}}};

  // As the job manager's Devices(visible): another's job is not named.
  auto devices = [&](const LiveMetrics::Visible& visible) {
    fitrun::v1::Device shown = busy;
    if (!visible(job.job)) {
      shown.clear_job_id();
      shown.clear_rank();
      shown.set_held_by_another_user(true);
    }
    return std::vector<fitrun::v1::Device>{shown, idle};
  };
  LiveMetrics live(devices, [&] { return std::vector<JobManager::RunningJob>{job, starting}; });
  const std::string text = Text(live);
  EXPECT_TRUE(absl::StrContains(text, "# TYPE fitrun_device_memory_total_bytes gauge"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_device_memory_total_bytes{device=\"cuda:0\"} 25769803776"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_device_memory_free_bytes{device=\"cuda:0\"} 21474836480"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_device_memory_planned_bytes{device=\"cuda:0\"} 104857600"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_device_memory_peak_bytes{device=\"cuda:0\"} 94371840"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_device_memory_planned_bytes{device=\"cuda:1\"} 0"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_device_job_info{device=\"cuda:0\",job_id=\"j1\",rank=\"1\"} 1"));
  EXPECT_FALSE(absl::StrContains(text, "fitrun_device_job_info{device=\"cuda:1\""));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_info{job_id=\"j1\",name=\"gpt2 \\\"small\\\"\",owner=\"ada\"} 1"))
      << text;
  // Throughput adds up over ranks; the exposed share is their mean.
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_samples_per_second{job_id=\"j1\"} 610"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_exposed_communication_ratio{job_id=\"j1\"} 0.2"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_step_seconds{job_id=\"j1\"} 0.05"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_loss{job_id=\"j1\"} 2.5"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_step{job_id=\"j1\"} 12"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_total_steps{job_id=\"j1\"} 500"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_per_device_batch{job_id=\"j1\"} 16"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_grad_accum_steps{job_id=\"j1\"} 4"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_exposed_communication_ratio{job_id=\"j2\"} 0"));
  EXPECT_TRUE(absl::StrContains(text, "fitrun_job_step{job_id=\"j2\"} 0"));
}

TEST(LiveMetricsTest, AScraperSeesOnlyTheJobsItMaySee) {
  fitrun::v1::Device busy;
  busy.set_id("cpu:0");
  busy.set_job_id("j1");
  JobManager::RunningJob adas;
  adas.job.set_id("j1");
  adas.job.set_owner("ada");
  adas.job.mutable_spec()->set_name("secret-project");
  JobManager::RunningJob bobs;
  bobs.job.set_id("j2");
  bobs.job.set_owner("bob");
  LiveMetrics live(
      [&](const LiveMetrics::Visible& visible) {
        fitrun::v1::Device shown = busy;
        if (!visible(adas.job)) shown.clear_job_id();
        return std::vector<fitrun::v1::Device>{shown};
      },
      [&] { return std::vector<JobManager::RunningJob>{adas, bobs}; });
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(
      out, live.CollectFor([](const fitrun::v1::Job& job) { return job.owner() == "bob"; }));
  const std::string bob_sees = out.str();
  EXPECT_FALSE(absl::StrContains(bob_sees, "j1")) << bob_sees;
  EXPECT_FALSE(absl::StrContains(bob_sees, "secret-project"));
  EXPECT_TRUE(absl::StrContains(bob_sees, "fitrun_job_info{job_id=\"j2\",name=\"\",owner=\"bob\"} 1"));
  EXPECT_TRUE(absl::StrContains(bob_sees, "fitrun_device_memory_total_bytes{device=\"cpu:0\"}")) << "devices are everyone's";
  EXPECT_TRUE(absl::StrContains(Text(live), "j1")) << "an admin's scrape (Collect) sees every job";
}

}  // namespace
}  // namespace fitrun::server
