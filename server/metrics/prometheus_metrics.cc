#include "server/metrics/prometheus_metrics.h"

#include "absl/strings/ascii.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

namespace {

// Seconds from a moment's wait to a day's run: queue waits and job durations share them.
prometheus::Histogram::BucketBoundaries WaitBuckets() {
  return {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600};
}

const char* const kFinalStates[] = {"succeeded", "failed", "cancelled"};

}  // namespace

PrometheusMetrics::PrometheusMetrics(prometheus::Registry& registry, const std::string& version, absl::Time started)
    : jobs_(prometheus::BuildGauge().Name("fitrun_jobs").Help("Jobs in each state.").Register(registry)),
      events_(prometheus::BuildCounter()
                  .Name("fitrun_events_received_total")
                  .Help("Job events recorded, by kind.")
                  .Register(registry)),
      steps_(prometheus::BuildCounter()
                 .Name("fitrun_training_steps_total")
                 .Help("Optimizer steps completed across all jobs.")
                 .Register(registry)
                 .Add({})),
      out_of_memory_(prometheus::BuildCounter()
                         .Name("fitrun_out_of_memory_total")
                         .Help("Ranks that ran out of device memory.")
                         .Register(registry)
                         .Add({})),
      restarts_(prometheus::BuildCounter()
                    .Name("fitrun_job_restarts_total")
                    .Help("Restarts of a job's whole group of ranks, by reason.")
                    .Register(registry)),
      recovery_seconds_(prometheus::BuildHistogram()
                            .Name("fitrun_recovery_seconds")
                            .Help("From a failure being detected to the next attempt's first training step.")
                            .Register(registry)
                            .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 5, 10, 15, 30, 60, 120, 300})),
      prediction_ratio_(prometheus::BuildHistogram()
                            .Name("fitrun_memory_prediction_ratio")
                            .Help("Each rank's measured peak memory over its plan's predicted peak, per finished "
                                  "attempt: above 1, the plan promised too little.")
                            .Register(registry)
                            .Add({}, prometheus::Histogram::BucketBoundaries{0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 1.0,
                                                                             1.03, 1.05, 1.1, 1.25, 1.5})),
      probe_seconds_(prometheus::BuildHistogram()
                         .Name("fitrun_memory_probe_seconds")
                         .Help("How long each memory probe (a calibration sweep or one measurement) ran.")
                         .Register(registry)
                         .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 5, 10, 20, 30, 60, 120, 300})),
      queue_wait_(prometheus::BuildHistogram()
                      .Name("fitrun_job_queue_wait_seconds")
                      .Help("From a job's submission to its first launch (its whole life if it never launched), "
                            "observed when it ends, by final state.")
                      .Register(registry)),
      duration_(prometheus::BuildHistogram()
                    .Name("fitrun_job_duration_seconds")
                    .Help("From a job's submission to its end, by final state.")
                    .Register(registry)),
      checkpoint_saves_(prometheus::BuildCounter()
                            .Name("fitrun_checkpoint_saves_total")
                            .Help("Checkpoints written by jobs' rank 0.")
                            .Register(registry)
                            .Add({})),
      checkpoint_failures_(prometheus::BuildCounter()
                               .Name("fitrun_checkpoint_failures_total")
                               .Help("Checkpoints that could not be written (training went on from the previous one).")
                               .Register(registry)
                               .Add({})),
      checkpoint_seconds_(prometheus::BuildHistogram()
                              .Name("fitrun_checkpoint_save_seconds")
                              .Help("How long writing each checkpoint took.")
                              .Register(registry)
                              .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                                               10, 30, 60})) {
  prometheus::BuildGauge()
      .Name("fitrun_build_info")
      .Help("Always 1; its labels say which fitrund this is.")
      .Register(registry)
      .Add({{"version", version}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("fitrun_start_time_seconds")
      .Help("When fitrund started, in seconds since the Unix epoch.")
      .Register(registry)
      .Add({})
      .Set(absl::ToDoubleSeconds(started - absl::UnixEpoch()));
  // Every final state is present from the start, so rate() has a series before the first job ends.
  for (const char* state : kFinalStates) {
    queue_wait_.Add({{"state", state}}, WaitBuckets());
    duration_.Add({{"state", state}}, WaitBuckets());
  }
  // Every state is present from the start, so dashboards see zeros rather than gaps.
  for (int s = fitrun::v1::JOB_STATE_QUEUED; s <= fitrun::v1::JOB_STATE_CANCELLED; ++s) {
    jobs_.Add({{"state", absl::AsciiStrToLower(JobStateName(static_cast<fitrun::v1::JobState>(s)))}});
  }
  for (const char* reason : {"out_of_memory", "crash", "hang", "coordinator_restart"}) {
    restarts_.Add({{"reason", reason}});
  }
}

void PrometheusMetrics::OutOfMemory() { out_of_memory_.Increment(); }

void PrometheusMetrics::JobRestarted(const std::string& reason) { restarts_.Add({{"reason", reason}}).Increment(); }

void PrometheusMetrics::Recovered(absl::Duration time_to_recover) {
  recovery_seconds_.Observe(absl::ToDoubleSeconds(time_to_recover));
}

void PrometheusMetrics::MemoryPredictionObserved(double ratio) { prediction_ratio_.Observe(ratio); }

void PrometheusMetrics::MemoryProbeRan(absl::Duration took) { probe_seconds_.Observe(absl::ToDoubleSeconds(took)); }

void PrometheusMetrics::JobStateChanged(fitrun::v1::JobState from, fitrun::v1::JobState to) {
  if (from != fitrun::v1::JOB_STATE_UNSPECIFIED) {
    jobs_.Add({{"state", absl::AsciiStrToLower(JobStateName(from))}}).Decrement();
  }
  jobs_.Add({{"state", absl::AsciiStrToLower(JobStateName(to))}}).Increment();
}

void PrometheusMetrics::EventRecorded(const std::string& kind) { events_.Add({{"kind", kind}}).Increment(); }

void PrometheusMetrics::TrainingProgress(int64_t steps_advanced) {
  steps_.Increment(static_cast<double>(steps_advanced));
}

void PrometheusMetrics::JobEnded(fitrun::v1::JobState state, absl::Duration queue_wait, absl::Duration duration) {
  const std::string label = absl::AsciiStrToLower(JobStateName(state));
  queue_wait_.Add({{"state", label}}, WaitBuckets()).Observe(absl::ToDoubleSeconds(queue_wait));
  duration_.Add({{"state", label}}, WaitBuckets()).Observe(absl::ToDoubleSeconds(duration));
}

void PrometheusMetrics::CheckpointSaved(absl::Duration took) {
  checkpoint_saves_.Increment();
  checkpoint_seconds_.Observe(absl::ToDoubleSeconds(took));
}

void PrometheusMetrics::CheckpointFailed() { checkpoint_failures_.Increment(); }

}  // namespace fitrun::server
