// How a rank's reports become its job's events. Each report is recorded on the rank (its peak bytes,
// latest step and progress, its final report or failure), turned into the event watchers see, and
// counted in the metrics; rank 0's progress also moves the job's own progress and ends a recovery
// ("training resumed ... after the failure"). What a report leads to (a re-plan after an
// out-of-memory error, the job's success) is the job manager's decision: Ingest says which report
// asks for one.
//
// Thread-safety: stateless; the job manager calls it under its lock, with the entry it guards.
#ifndef FITRUN_SERVER_CORE_JOBS_REPORT_INGEST_H_
#define FITRUN_SERVER_CORE_JOBS_REPORT_INGEST_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "fitrun/v1/worker.pb.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/jobs/job_entry.h"

namespace fitrun::server {

class ReportIngest {
 public:
  struct Options {
    // Events one job may store before the events of its ranks' progress, log and checkpoint reports
    // are no longer kept (fitrund --max_events_per_job): the reports still move the ranks and the
    // job (progress, peaks), and its state changes, plans, out-of-memory and final reports are still
    // kept. 0: no cap.
    int64_t max_events_per_job = kDefaultMaxEventsPerJob;
  };
  static constexpr int64_t kDefaultMaxEventsPerJob = 100000;

  ReportIngest(CoordinatorMetrics* metrics, std::function<absl::Time()> clock, Options options)
      : metrics_(metrics), clock_(std::move(clock)), options_(options) {}
  ReportIngest(CoordinatorMetrics* metrics, std::function<absl::Time()> clock)
      : ReportIngest(metrics, std::move(clock), Options()) {}

  // What a report asks of the job manager once its events are out.
  enum class Next {
    kNothing,
    kOutOfMemory,  // the rank ran out of memory and exits on its own: stop its peers, re-plan
    kFinished,     // the rank finished: the job may have succeeded
  };
  struct Ingested {
    // In order; empty for a heartbeat, a hello or a nested batch.
    std::vector<fitrun::v1::JobEvent> events;
    Next next = Next::kNothing;
  };

  // One report of `rank` of the entry's active attempt (the caller checked that it is the active
  // one). Marks the rank heard from now.
  Ingested Ingest(JobEntry& entry, int rank, const fitrun::v1::WorkerReport& report) const;

  // What one report may carry. Reports are the job's code's word (a script writes them), and each
  // event is kept in memory for the job's watchers and in the store for good: a log line or a
  // failure's reason is cut to kMaxTextBytes (at a character's boundary), and any other report
  // larger than kMaxReportBytes is not kept (a line says so).
  static constexpr size_t kMaxTextBytes = 16 * 1024;
  static constexpr size_t kMaxReportBytes = 64 * 1024;
  // And how fast: every report of a rank (heartbeats too) takes from a budget of kReportBurstBytes at
  // once and kReportBytesPerSecond after that (a training step's report is a few hundred bytes); past
  // it reports are dropped, and the job's events say how many, at most every kDropsToldEvery.
  // A rank's attempt ends once: its first final or failure report (and one out-of-memory report
  // before it) always goes through, whatever the budget, and costs it like any other; every later
  // one is dropped and counted the same way, since a job token is all it takes to send them.
  static constexpr double kReportBytesPerSecond = 1 << 20;
  static constexpr double kReportBurstBytes = 16 << 20;
  static constexpr absl::Duration kDropsToldEvery = absl::Seconds(10);

 private:
  // Whether the report is one more final, failure or out-of-memory report than a rank's attempt
  // may send (recording the first ones on the rank).
  static bool RepeatsAnEnd(RankState& rank, const fitrun::v1::WorkerReport& report);
  // Takes the report's bytes from the rank's budget; false when it is spent (a first final report
  // passes anyway).
  bool WithinBudget(RankState& rank, const fitrun::v1::WorkerReport& report, bool ends, absl::Time now) const;
  // The line saying how many of the rank's reports were dropped, when it is time to say it (or
  // `now_or_never`: its attempt ended).
  std::optional<fitrun::v1::JobEvent> DropsLine(RankState& rank, int rank_index, absl::Time now,
                                                bool now_or_never) const;
  // Whether the job has stored as many events as its ranks' chatter may take; says so once.
  bool OverEventCap(JobEntry& entry, Ingested& ingested) const;
  // Whether the report is not taken: larger than a report may be, one end too many, or past the
  // rank's budget; the line saying so, when it is time, goes into `ingested`.
  bool Refused(RankState& rank, int rank_index, const fitrun::v1::WorkerReport& report, absl::Time now,
               Ingested& ingested) const;
  // Before a rank's final or failure report: what was dropped of its reports, and of the job's past
  // its event cap.
  void AddLastWords(JobEntry& entry, RankState& rank, int rank_index, absl::Time now, Ingested& ingested) const;
  // A progress report: the rank's peaks and step, and rank 0's the job's (and, after a failure, the
  // line that training resumed).
  void TakeProgress(JobEntry& entry, int rank_index, const fitrun::v1::Progress& progress, absl::Time now,
                    fitrun::v1::JobEvent& event, Ingested& ingested) const;

  CoordinatorMetrics* const metrics_;
  const std::function<absl::Time()> clock_;
  const Options options_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_REPORT_INGEST_H_
