// What is true now of the devices and the running jobs, read from the job manager each time
// /metrics is scraped, so a series exists exactly while its device or job does (label sets are
// bounded by the devices) and nothing has to be removed when a job ends.
//
// Series (docs/monitoring.md, "The metric catalog", lists them all):
//   fitrun_device_memory_{total,free,planned,peak}_bytes{device}   planned and peak: 0 while idle
//   fitrun_device_job_info{device,job_id,rank}                      1 while a rank holds the device
//   fitrun_job_info{job_id,name,owner}                              1 per running job
//   fitrun_job_{samples_per_second,step_seconds,exposed_communication_ratio,loss,step,total_steps,
//               per_device_batch,grad_accum_steps}{job_id}
#ifndef FITRUN_SERVER_METRICS_LIVE_METRICS_H_
#define FITRUN_SERVER_METRICS_LIVE_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>
#include <vector>

#include "fitrun/v1/job.pb.h"
#include "server/core/jobs/job_manager.h"

namespace fitrun::server {

// Who sees a job's series: a scrape shows only the jobs its caller may see (their own; an admin's:
// every one), and a device held by another's job without that job.
class LiveMetrics : public prometheus::Collectable {
 public:
  using Visible = std::function<bool(const fitrun::v1::Job&)>;
  using DevicesSource = std::function<std::vector<fitrun::v1::Device>(const Visible&)>;
  using RunningSource = std::function<std::vector<JobManager::RunningJob>()>;
  LiveMetrics(DevicesSource devices, RunningSource running)
      : devices_(std::move(devices)), running_(std::move(running)) {}
  // Reads the manager's Devices() and Running(); it must outlive this.
  explicit LiveMetrics(JobManager* manager)
      : LiveMetrics([manager](const Visible& visible) { return manager->Devices(visible); },
                    [manager] { return manager->Running(); }) {}

  // Every series, as an admin sees them.
  std::vector<prometheus::MetricFamily> Collect() const override;
  // The series of the jobs `visible` accepts (and every device, without the others' jobs).
  std::vector<prometheus::MetricFamily> CollectFor(const Visible& visible) const;

 private:
  const DevicesSource devices_;
  const RunningSource running_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_METRICS_LIVE_METRICS_H_
