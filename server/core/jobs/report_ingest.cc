#include "server/core/jobs/report_ingest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fitrun::server {
namespace {

// `text` cut to at most `limit` bytes, not inside a UTF-8 character (a string field must stay valid
// UTF-8), with how much was cut.
std::string CutText(const std::string& text, size_t limit) {
  if (text.size() <= limit) return text;
  size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return absl::StrCat(text.substr(0, end), " [", text.size() - end, " more bytes cut]");
}

}  // namespace

ReportIngest::Ingested ReportIngest::Ingest(JobEntry& entry, int rank_index,
                                            const fitrun::v1::WorkerReport& report) const {
  Ingested ingested;
  fitrun::v1::Job& job = entry.record.job;
  ActiveAttempt& attempt = *entry.active;
  RankState& rank = attempt.ranks[rank_index];
  const absl::Time now = clock_();
  rank.last_heard = now;
  fitrun::v1::JobEvent event;
  if (const size_t bytes = report.ByteSizeLong();
      bytes > kMaxReportBytes && !report.has_log() && !report.has_failed()) {
    const auto* kind = report.GetDescriptor()->FindFieldByNumber(report.report_case());
    event.mutable_log()->set_rank(rank_index);
    event.mutable_log()->set_text(absl::StrCat("rank ", rank_index, " sent a ", kind == nullptr ? "" : kind->name(),
                                               " report of ", bytes, " bytes, more than the ", kMaxReportBytes,
                                               " a report may carry; it was not kept"));
    ingested.events.push_back(std::move(event));
    return ingested;
  }
  if (report.has_progress() || report.has_log() || report.has_checkpoint_saved() || report.has_checkpoint_failed()) {
    if (rank.report_budget_bytes < 0) {
      rank.report_budget_bytes = kReportBurstBytes;
    } else if (now > rank.report_budget_at) {
      rank.report_budget_bytes = std::min(
          kReportBurstBytes,
          rank.report_budget_bytes + kReportBytesPerSecond * absl::ToDoubleSeconds(now - rank.report_budget_at));
    }
    rank.report_budget_at = now;
    const double bytes = static_cast<double>(report.ByteSizeLong());
    if (bytes > rank.report_budget_bytes) {
      ++rank.reports_dropped;
      if (now - rank.drops_told_at >= kDropsToldEvery) {
        event.mutable_log()->set_rank(rank_index);
        event.mutable_log()->set_text(absl::StrFormat(
            "rank %d sends reports faster than %.0f KiB/s: %d were not kept", rank_index,
            kReportBytesPerSecond / 1024, rank.reports_dropped));
        rank.reports_dropped = 0;
        rank.drops_told_at = now;
        ingested.events.push_back(std::move(event));
      }
      return ingested;
    }
    rank.report_budget_bytes -= bytes;
  }
  switch (report.report_case()) {
    case fitrun::v1::WorkerReport::kProgress: {
      *event.mutable_progress() = report.progress();
      event.mutable_progress()->set_rank(rank_index);
      rank.peak_bytes = std::max(rank.peak_bytes, report.progress().peak_bytes());
      rank.reserved_peak_bytes = std::max(rank.reserved_peak_bytes, report.progress().reserved_peak_bytes());
      rank.device_peak_bytes = std::max(rank.device_peak_bytes, report.progress().device_peak_bytes());
      rank.last_step = std::max(rank.last_step, report.progress().step());
      rank.last_progress = event.progress();
      if (rank_index == 0) {
        const int64_t advanced = report.progress().step() - job.last_progress().step();
        *job.mutable_last_progress() = event.progress();
        metrics_->TrainingProgress(std::max<int64_t>(0, advanced));
        if (entry.recovering_since && job.state() == fitrun::v1::JOB_STATE_RUNNING) {
          const absl::Duration took = now - *entry.recovering_since;
          entry.recovering_since.reset();
          metrics_->Recovered(took);
          fitrun::v1::JobEvent resumed;
          resumed.mutable_log()->set_rank(-1);
          resumed.mutable_log()->set_text(absl::StrFormat("training resumed at step %d of attempt %d, %.1f s after the failure",
                                                          report.progress().step(), attempt.attempt,
                                                          absl::ToDoubleSeconds(took)));
          ingested.events.push_back(std::move(resumed));
        }
      }
      break;
    }
    case fitrun::v1::WorkerReport::kOom:
      *event.mutable_oom() = report.oom();
      event.mutable_oom()->set_rank(rank_index);
      rank.exiting_on_its_own = true;
      attempt.out_of_memory = true;
      ingested.next = Next::kOutOfMemory;
      break;
    case fitrun::v1::WorkerReport::kCheckpointSaved:
      *event.mutable_checkpoint_saved() = report.checkpoint_saved();
      event.mutable_checkpoint_saved()->set_rank(rank_index);
      metrics_->CheckpointSaved(absl::Seconds(report.checkpoint_saved().seconds()));
      break;
    case fitrun::v1::WorkerReport::kCheckpointFailed:
      *event.mutable_checkpoint_failed() = report.checkpoint_failed();
      event.mutable_checkpoint_failed()->set_rank(rank_index);
      metrics_->CheckpointFailed();
      break;
    case fitrun::v1::WorkerReport::kLog:
      event.mutable_log()->set_text(CutText(report.log().text(), kMaxTextBytes));
      event.mutable_log()->set_rank(rank_index);
      break;
    case fitrun::v1::WorkerReport::kFinished:
      rank.finished = report.finished();
      rank.finished->set_rank(rank_index);
      if (rank.peak_bytes == 0) rank.peak_bytes = rank.finished->peak_bytes();
      rank.reserved_peak_bytes = std::max(rank.reserved_peak_bytes, rank.finished->reserved_peak_bytes());
      rank.device_peak_bytes = std::max(rank.device_peak_bytes, rank.finished->device_peak_bytes());
      *event.mutable_rank_finished() = *rank.finished;
      ingested.next = Next::kFinished;
      break;
    case fitrun::v1::WorkerReport::kFailed:
      rank.failure_report = CutText(report.failed().reason(), kMaxTextBytes);
      event.mutable_log()->set_rank(rank_index);
      event.mutable_log()->set_text(absl::StrCat("failed: ", rank.failure_report));
      break;
    default:
      return ingested;  // heartbeats carry no event; a hello or nested batch here is ignored
  }
  ingested.events.push_back(std::move(event));
  return ingested;
}

}  // namespace fitrun::server
