// CoordinatorMetrics as Prometheus series in a registry that main owns and exposes on /metrics.
//
// Series (names fitrun_<noun>_<unit>):
//   fitrun_jobs{state}                    gauge: jobs in each state
//   fitrun_events_received_total{kind}    counter: job events recorded, by kind
//   fitrun_training_steps_total           counter: optimizer steps completed by all jobs (rank 0)
//   fitrun_running_job_loss{job_id}       gauge: latest loss of each running job; the series is
//                                         removed when the job stops, so it is bounded by devices
//   fitrun_out_of_memory_total            counter: ranks that ran out of device memory
//   fitrun_job_restarts_total{reason}     counter: group restarts by reason (out_of_memory, crash,
//                                         hang, coordinator_restart)
//   fitrun_recovery_seconds               histogram: from a failure to the next attempt's first step
//   fitrun_memory_prediction_ratio         histogram: each rank's measured peak over its plan's
//                                         predicted peak, per finished attempt (the estimator's error)
//   fitrun_memory_probe_seconds           histogram: how long each memory probe ran
// Thread-safe (prometheus-cpp's metrics are; the per-job map has its own mutex).
#ifndef FITRUN_SERVER_METRICS_PROMETHEUS_METRICS_H_
#define FITRUN_SERVER_METRICS_PROMETHEUS_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/core/coordinator_metrics.h"

namespace fitrun::server {

class PrometheusMetrics : public CoordinatorMetrics {
 public:
  explicit PrometheusMetrics(prometheus::Registry& registry);

  void JobStateChanged(fitrun::v1::JobState from, fitrun::v1::JobState to) override;
  void EventRecorded(const std::string& kind) override;
  void TrainingProgress(const std::string& job_id, int64_t steps_advanced, double loss) override;
  void JobStopped(const std::string& job_id) override;
  void OutOfMemory() override;
  void JobRestarted(const std::string& reason) override;
  void Recovered(absl::Duration time_to_recover) override;
  void MemoryPredictionObserved(double ratio) override;
  void MemoryProbeRan(absl::Duration took) override;

 private:
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Counter>& events_;
  prometheus::Counter& steps_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Counter& out_of_memory_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Histogram& recovery_seconds_;
  prometheus::Histogram& prediction_ratio_;
  prometheus::Histogram& probe_seconds_;
  absl::Mutex mu_;
  std::map<std::string, prometheus::Gauge*> loss_by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_METRICS_PROMETHEUS_METRICS_H_
