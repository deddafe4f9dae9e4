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
                .Register(registry)) {
  // Every state is present from the start, so dashboards see zeros rather than gaps.
  for (int s = fitrun::v1::JOB_STATE_QUEUED; s <= fitrun::v1::JOB_STATE_CANCELLED; ++s) {
    jobs_.Add({{"state", absl::AsciiStrToLower(JobStateName(static_cast<fitrun::v1::JobState>(s)))}});
  }
}

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
