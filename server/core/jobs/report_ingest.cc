#include "server/core/jobs/report_ingest.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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

bool ReportIngest::RepeatsAnEnd(RankState& rank, const fitrun::v1::WorkerReport& report) {
  if (report.has_oom()) {
    if (rank.end_reported || rank.oom_reported) return true;
    rank.oom_reported = true;
    return false;
  }
  if (report.has_finished() || report.has_failed()) {
    if (rank.end_reported) return true;
    rank.end_reported = true;
  }
  return false;
}

bool ReportIngest::WithinBudget(RankState& rank, const fitrun::v1::WorkerReport& report, bool ends,
                                absl::Time now) const {
  if (rank.report_budget_bytes == -1) {
    rank.report_budget_bytes = kReportBurstBytes;
  } else if (now > rank.report_budget_at) {
    rank.report_budget_bytes = std::min(
        kReportBurstBytes,
        rank.report_budget_bytes + kReportBytesPerSecond * absl::ToDoubleSeconds(now - rank.report_budget_at));
  }
  rank.report_budget_at = now;
  const double bytes = static_cast<double>(report.ByteSizeLong());
  if (bytes > rank.report_budget_bytes && !ends) return false;
  // A first final report may leave the budget in debt: the rank's later reports pay it back.
  rank.report_budget_bytes -= bytes;
  return true;
}

std::optional<fitrun::v1::JobEvent> ReportIngest::DropsLine(RankState& rank, int rank_index, absl::Time now,
                                                            bool now_or_never) const {
  if (rank.reports_dropped == 0 && rank.repeated_ends_dropped == 0) return std::nullopt;
  if (!now_or_never && now - rank.drops_told_at < kDropsToldEvery) return std::nullopt;
  std::vector<std::string> parts;
  if (rank.reports_dropped > 0) {
    parts.push_back(absl::StrFormat("rank %d sends reports faster than %.0f KiB/s: %d were not kept", rank_index,
                                    kReportBytesPerSecond / 1024, rank.reports_dropped));
  }
  if (rank.repeated_ends_dropped > 0) {
    parts.push_back(absl::StrFormat(
        "rank %d sent %d more final, failure or out-of-memory reports than its attempt's one end; they were not kept",
        rank_index, rank.repeated_ends_dropped));
  }
  fitrun::v1::JobEvent event;
  event.mutable_log()->set_rank(rank_index);
  event.mutable_log()->set_text(absl::StrJoin(parts, "; "));
  rank.reports_dropped = 0;
  rank.repeated_ends_dropped = 0;
  rank.drops_told_at = now;
  return event;
}

bool ReportIngest::OverEventCap(JobEntry& entry, Ingested& ingested) const {
  if (options_.max_events_per_job <= 0 || entry.record.job.last_sequence() < options_.max_events_per_job) {
    return false;
  }
  if (entry.reports_over_event_cap++ == 0) {
    fitrun::v1::JobEvent event;
    event.mutable_log()->set_rank(-1);
    event.mutable_log()->set_text(absl::StrCat(
        "the job has stored ", entry.record.job.last_sequence(), " events, the most a job keeps (fitrund ",
        "--max_events_per_job): from here its ranks' progress, log and checkpoint reports are not kept as events ",
        "(its progress still moves); its state changes, plans, out-of-memory and final reports still are, and its ",
        "ranks' ends say how many were not kept"));
    ingested.events.push_back(std::move(event));
  }
  return true;
}

void ReportIngest::AddLastWords(JobEntry& entry, RankState& rank, int rank_index, absl::Time now,
                                Ingested& ingested) const {
  if (std::optional<fitrun::v1::JobEvent> line = DropsLine(rank, rank_index, now, true)) {
    ingested.events.push_back(*std::move(line));
  }
  if (entry.reports_over_event_cap > 0) {
    fitrun::v1::JobEvent over;
    over.mutable_log()->set_rank(-1);
    over.mutable_log()->set_text(absl::StrCat(entry.reports_over_event_cap, " progress, log and checkpoint ",
                                              "reports of the job's ranks were not kept so far, past its ",
                                              options_.max_events_per_job, " events"));
    ingested.events.push_back(std::move(over));
  }
}

void ReportIngest::TakeProgress(JobEntry& entry, int rank_index, const fitrun::v1::Progress& progress, absl::Time now,
                                fitrun::v1::JobEvent& event, Ingested& ingested) const {
  fitrun::v1::Job& job = entry.record.job;
  RankState& rank = entry.active->ranks[rank_index];
  *event.mutable_progress() = progress;
  event.mutable_progress()->set_rank(rank_index);
  rank.peak_bytes = std::max(rank.peak_bytes, progress.peak_bytes());
  rank.reserved_peak_bytes = std::max(rank.reserved_peak_bytes, progress.reserved_peak_bytes());
  rank.device_peak_bytes = std::max(rank.device_peak_bytes, progress.device_peak_bytes());
  rank.last_step = std::max(rank.last_step, progress.step());
  rank.last_progress = event.progress();
  if (rank_index != 0) return;
  const int64_t advanced = progress.step() - job.last_progress().step();
  *job.mutable_last_progress() = event.progress();
  metrics_->TrainingProgress(std::max<int64_t>(0, advanced));
  if (entry.recovering_since && job.state() == fitrun::v1::JOB_STATE_RUNNING) {
    const absl::Duration took = now - *entry.recovering_since;
    entry.recovering_since.reset();
    metrics_->Recovered(took);
    fitrun::v1::JobEvent resumed;
    resumed.mutable_log()->set_rank(-1);
    resumed.mutable_log()->set_text(absl::StrFormat("training resumed at step %d of attempt %d, %.1f s after the failure",
                                                    progress.step(), entry.active->attempt, absl::ToDoubleSeconds(took)));
    ingested.events.push_back(std::move(resumed));
  }
}

bool ReportIngest::Refused(RankState& rank, int rank_index, const fitrun::v1::WorkerReport& report, absl::Time now,
                           Ingested& ingested) const {
  if (const size_t bytes = report.ByteSizeLong();
      bytes > kMaxReportBytes && !report.has_log() && !report.has_failed()) {
    const auto* kind = report.GetDescriptor()->FindFieldByNumber(report.report_case());
    fitrun::v1::JobEvent event;
    event.mutable_log()->set_rank(rank_index);
    event.mutable_log()->set_text(absl::StrCat("rank ", rank_index, " sent a ", kind == nullptr ? "" : kind->name(),
                                               " report of ", bytes, " bytes, more than the ", kMaxReportBytes,
                                               " a report may carry; it was not kept"));
    ingested.events.push_back(std::move(event));
    return true;
  }
  const bool ends = report.has_finished() || report.has_failed() || report.has_oom();
  const bool repeated = ends && RepeatsAnEnd(rank, report);
  // A repeated end costs the budget all the same.
  const bool within = WithinBudget(rank, report, ends && !repeated, now);
  if (!repeated && within) return false;
  ++(repeated ? rank.repeated_ends_dropped : rank.reports_dropped);
  if (std::optional<fitrun::v1::JobEvent> line = DropsLine(rank, rank_index, now, false)) {
    ingested.events.push_back(*std::move(line));
  }
  return true;
}

ReportIngest::Ingested ReportIngest::Ingest(JobEntry& entry, int rank_index,
                                            const fitrun::v1::WorkerReport& report) const {
  Ingested ingested;
  ActiveAttempt& attempt = *entry.active;
  RankState& rank = attempt.ranks[rank_index];
  const absl::Time now = clock_();
  rank.last_heard = now;
  if (Refused(rank, rank_index, report, now, ingested)) return ingested;
  fitrun::v1::JobEvent event;
  const bool chatter =
      report.has_progress() || report.has_log() || report.has_checkpoint_saved() || report.has_checkpoint_failed();
  // Past the cap the report still moves the rank and the job (their progress, peaks); only its
  // event is not kept.
  const bool keep_event = !(chatter && OverEventCap(entry, ingested));
  if (report.has_finished() || report.has_failed()) AddLastWords(entry, rank, rank_index, now, ingested);
  switch (report.report_case()) {
    case fitrun::v1::WorkerReport::kProgress:
      TakeProgress(entry, rank_index, report.progress(), now, event, ingested);
      break;
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
  if (keep_event) ingested.events.push_back(std::move(event));
  return ingested;
}

}  // namespace fitrun::server
