#include "server/metrics/prometheus_metrics.h"

#include "absl/strings/ascii.h"
#include "server/core/job_spec.h"

namespace fitrun::server {

PrometheusMetrics::PrometheusMetrics(prometheus::Registry& registry)
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
      loss_(prometheus::BuildGauge()
                .Name("fitrun_running_job_loss")
                .Help("Latest training loss of each running job.")
                .Register(registry)),
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
                         .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 5, 10, 20, 30, 60, 120, 300})) {
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

void PrometheusMetrics::TrainingProgress(const std::string& job_id, int64_t steps_advanced, double loss) {
  steps_.Increment(static_cast<double>(steps_advanced));
  absl::MutexLock lock(&mu_);
  auto it = loss_by_job_.find(job_id);
  if (it == loss_by_job_.end()) it = loss_by_job_.emplace(job_id, &loss_.Add({{"job_id", job_id}})).first;
  it->second->Set(loss);
}

void PrometheusMetrics::JobStopped(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = loss_by_job_.find(job_id);
  if (it == loss_by_job_.end()) return;
  loss_.Remove(it->second);
  loss_by_job_.erase(it);
}

}  // namespace fitrun::server
