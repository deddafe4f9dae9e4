// The ranks' side of the coordinator: a rank's hello checked against its job's secret and attempt
// (and its connection kept for commands), and its reports taken in: turned into events, rank
// state and metrics (report_ingest.h), then into what they lead to (an OOM's fail-over, a finish's
// success, a script's first steps measured, a move at a checkpoint).
//
// Thread-safety: none of its own; the job manager holds it under its lock, and waits for an attempt
// still launching before it calls here.
#ifndef FITRUN_SERVER_CORE_JOBS_WORKER_SESSIONS_H_
#define FITRUN_SERVER_CORE_JOBS_WORKER_SESSIONS_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "fitrun/v1/worker.pb.h"
#include "server/core/jobs/attempts.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/jobs/job_table.h"
#include "server/core/jobs/report_ingest.h"
#include "server/core/jobs/run_memory.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

class WorkerSessions {
 public:
  // Every pointer must outlive this.
  WorkerSessions(JobTable* table, Attempts* attempts, RunMemory* run_memory, CoordinatorMetrics* metrics,
                 std::function<absl::Time()> clock, ReportIngest::Options ingest)
      : table_(table),
        attempts_(attempts),
        run_memory_(run_memory),
        clock_(clock),
        ingest_(metrics, std::move(clock), ingest) {}

  // Checks the Hello (job, attempt, rank, token) and registers the connection for commands.
  absl::StatusOr<WorkerKey> Attach(const fitrun::v1::Hello& hello, std::weak_ptr<WorkerConnection> connection);
  // Several reports of one rank: their events are stored in one transaction (a group commit) and
  // published together, but for those a report's consequence must follow (an OOM, a finish).
  void TakeReports(const WorkerKey& key, absl::Span<const fitrun::v1::WorkerReport* const> reports);

 private:
  JobTable* const table_;
  Attempts* const attempts_;
  RunMemory* const run_memory_;
  const std::function<absl::Time()> clock_;
  const ReportIngest ingest_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_WORKER_SESSIONS_H_
