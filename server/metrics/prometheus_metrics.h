// CoordinatorMetrics as Prometheus series in a registry that the server owns and serves on /metrics:
// what happens (jobs changing state, events, restarts, probes, checkpoints, finished attempts' memory
// against their plans). What is true now of devices and running jobs is read from the job manager
// when scraped (live_metrics.h). docs/monitoring.md's "The metric catalog" lists both.
// Thread-safe (prometheus-cpp's metrics are).
#ifndef FITRUN_SERVER_METRICS_PROMETHEUS_METRICS_H_
#define FITRUN_SERVER_METRICS_PROMETHEUS_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>

#include "absl/time/time.h"
#include "server/core/coordinator_metrics.h"

namespace fitrun::server {

class PrometheusMetrics : public CoordinatorMetrics {
 public:
  // `version` is fitrund's (fitrun_build_info); `started` its start (fitrun_start_time_seconds).
  PrometheusMetrics(prometheus::Registry& registry, const std::string& version, absl::Time started);

  void JobStateChanged(fitrun::v1::JobState from, fitrun::v1::JobState to) override;
  void EventRecorded(const std::string& kind) override;
  void TrainingProgress(int64_t steps_advanced) override;
  void OutOfMemory() override;
  void JobRestarted(const std::string& reason) override;
  void Recovered(absl::Duration time_to_recover) override;
  void MemoryPredictionObserved(double ratio) override;
  void MemoryProbeRan(absl::Duration took) override;
  void JobEnded(fitrun::v1::JobState state, absl::Duration queue_wait, absl::Duration duration) override;
  void CheckpointSaved(absl::Duration took) override;
  void CheckpointFailed() override;

 private:
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Counter>& events_;
  prometheus::Counter& steps_;
  prometheus::Counter& out_of_memory_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Histogram& recovery_seconds_;
  prometheus::Histogram& prediction_ratio_;
  prometheus::Histogram& probe_seconds_;
  prometheus::Family<prometheus::Histogram>& queue_wait_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Counter& checkpoint_saves_;
  prometheus::Counter& checkpoint_failures_;
  prometheus::Histogram& checkpoint_seconds_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_METRICS_PROMETHEUS_METRICS_H_
