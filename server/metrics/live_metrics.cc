#include "server/metrics/live_metrics.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fitrun::server {
namespace {

prometheus::MetricFamily Gauge(std::string name, std::string help) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = prometheus::MetricType::Gauge;
  return family;
}

void Add(prometheus::MetricFamily& family, std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

}  // namespace

std::vector<prometheus::MetricFamily> LiveMetrics::Collect() const {
  return CollectFor([](const fitrun::v1::Job&) { return true; });
}

std::vector<prometheus::MetricFamily> LiveMetrics::CollectFor(const Visible& visible) const {
  prometheus::MetricFamily total = Gauge("fitrun_device_memory_total_bytes", "Each device's memory.");
  prometheus::MetricFamily free =
      Gauge("fitrun_device_memory_free_bytes", "Each device's memory not in use.");
  prometheus::MetricFamily planned = Gauge(
      "fitrun_device_memory_planned_bytes", "The plan's predicted peak for the rank holding the device (0: idle).");
  prometheus::MetricFamily peak = Gauge("fitrun_device_memory_peak_bytes",
                                        "The highest peak the rank holding the device has reported (0: idle).");
  prometheus::MetricFamily holder =
      Gauge("fitrun_device_job_info", "1 for the job and rank holding each busy device.");
  for (const fitrun::v1::Device& device : devices_(visible)) {
    const std::vector<prometheus::ClientMetric::Label> labels = {{"device", device.id()}};
    Add(total, labels, static_cast<double>(device.total_bytes()));
    Add(free, labels, static_cast<double>(device.free_bytes()));
    Add(planned, labels, static_cast<double>(device.planned_bytes()));
    Add(peak, labels, static_cast<double>(device.peak_bytes()));
    if (!device.job_id().empty()) {
      Add(holder, {{"device", device.id()}, {"job_id", device.job_id()}, {"rank", absl::StrCat(device.rank())}}, 1);
    }
  }

  prometheus::MetricFamily info = Gauge("fitrun_job_info", "1 for each running job, with its name and owner.");
  prometheus::MetricFamily samples =
      Gauge("fitrun_job_samples_per_second", "Training samples per second of each running job, all ranks together.");
  prometheus::MetricFamily step_seconds =
      Gauge("fitrun_job_step_seconds", "Wall time of an optimizer step of each running job (rank 0, latest report).");
  prometheus::MetricFamily exposed = Gauge(
      "fitrun_job_exposed_communication_ratio",
      "Share of each running job's step time its ranks spent blocked on gradient communication (mean over ranks).");
  prometheus::MetricFamily loss = Gauge("fitrun_job_loss", "Latest training loss of each running job.");
  prometheus::MetricFamily step = Gauge("fitrun_job_step", "Optimizer steps each running job has completed.");
  prometheus::MetricFamily total_steps = Gauge("fitrun_job_total_steps", "Optimizer steps each running job will run.");
  prometheus::MetricFamily batch = Gauge("fitrun_job_per_device_batch", "Each running job's per-device batch.");
  prometheus::MetricFamily accumulation =
      Gauge("fitrun_job_grad_accum_steps", "Each running job's micro-batches per optimizer step.");
  for (const JobManager::RunningJob& running : running_()) {
    const fitrun::v1::Job& job = running.job;
    if (!visible(job)) continue;
    const std::vector<prometheus::ClientMetric::Label> labels = {{"job_id", job.id()}};
    Add(info, {{"job_id", job.id()}, {"name", job.spec().name()}, {"owner", job.owner()}}, 1);
    double samples_per_second = 0;
    double exposed_sum = 0;
    int reporting = 0;
    for (const JobManager::RankView& rank : running.ranks) {
      samples_per_second += rank.last_progress.samples_per_second();
      if (rank.last_progress.step() > 0) {
        exposed_sum += rank.last_progress.exposed_communication_share();
        ++reporting;
      }
    }
    const fitrun::v1::Progress rank0 =
        running.ranks.empty() ? fitrun::v1::Progress() : running.ranks.front().last_progress;
    Add(samples, labels, samples_per_second);
    Add(step_seconds, labels, rank0.step_seconds());
    Add(exposed, labels, reporting > 0 ? exposed_sum / reporting : 0);
    Add(loss, labels, rank0.loss());
    Add(step, labels, static_cast<double>(rank0.step()));
    Add(total_steps, labels, static_cast<double>(job.plan().total_steps()));
    Add(batch, labels, static_cast<double>(job.plan().per_device_batch()));
    Add(accumulation, labels, static_cast<double>(job.plan().grad_accum_steps()));
  }
  std::vector<prometheus::MetricFamily> families;
  for (prometheus::MetricFamily* family : {&total, &free, &planned, &peak, &holder, &info, &samples, &step_seconds,
                                           &exposed, &loss, &step, &total_steps, &batch, &accumulation}) {
    families.push_back(std::move(*family));
  }
  return families;
}

}  // namespace fitrun::server
