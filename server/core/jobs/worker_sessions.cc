#include "server/core/jobs/worker_sessions.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/auth/same_secret.h"
#include "server/core/jobs/first_steps.h"

namespace fitrun::server {

using fitrun::v1::JobEvent;

absl::StatusOr<WorkerKey> WorkerSessions::Attach(const fitrun::v1::Hello& hello,
                                                 std::weak_ptr<WorkerConnection> connection) {
  // A missing job and a wrong token get one answer, and the comparison takes as long whatever the
  // token: a caller learns neither which jobs exist nor how much of a token it guessed.
  auto it = table_->jobs().find(hello.job_id());
  const bool matches = it != table_->jobs().end() && SameSecret(hello.job_token(), it->second.record.token);
  if (!matches) return absl::PermissionDeniedError("hello: no job with this job_id and job_token");
  JobEntry& entry = it->second;
  if (!entry.active || entry.active->attempt != hello.attempt()) {
    return absl::FailedPreconditionError(absl::StrCat("hello.attempt: attempt ", hello.attempt(), " of job ",
                                                      hello.job_id(), " is not running"));
  }
  if (hello.rank() < 0 || hello.rank() >= static_cast<int>(entry.active->ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat("hello.rank: ", hello.rank(), " is out of range"));
  }
  entry.active->ranks[hello.rank()].connection = connection;
  entry.active->ranks[hello.rank()].last_heard = clock_();
  if (JobTable::IsTerminal(entry.record.job.state())) {
    if (auto live = connection.lock()) live->SendStop("the job has ended");
  }
  return WorkerKey{hello.job_id(), hello.attempt(), hello.rank()};
}

void WorkerSessions::TakeReports(const WorkerKey& key, absl::Span<const fitrun::v1::WorkerReport* const> reports) {
  auto it = table_->jobs().find(key.job_id);
  if (it == table_->jobs().end()) return;
  JobEntry& entry = it->second;
  std::vector<JobEvent> events;
  for (const fitrun::v1::WorkerReport* report : reports) {
    // Checked per report: a finished rank below may end the attempt.
    if (!entry.active || entry.active->attempt != key.attempt) break;  // a late report of an older attempt
    ReportIngest::Ingested ingested = ingest_.Ingest(entry, key.rank, *report);
    for (JobEvent& event : ingested.events) events.push_back(std::move(event));
    if ((report->has_progress() || report->has_finished()) && FirstStepsDue(entry).has_value()) {
      // What a script's first steps measured goes out after the report that completed it (once per
      // attempt; otherwise a batch's events go to the store in one transaction).
      (void)table_->PublishAll(entry, std::exchange(events, {}));
      run_memory_->AfterFirstSteps(entry);
    }
    if (report->has_checkpoint_saved() && key.rank == 0 && entry.active && entry.active->move_at_checkpoint) {
      (void)table_->PublishAll(entry, std::exchange(events, {}));
      attempts_->MoveAtCheckpoint(entry, report->checkpoint_saved().step());
      break;
    }
    switch (ingested.next) {
      case ReportIngest::Next::kOutOfMemory: {
        // The OOM event goes out before the restart it leads to; the peers are stopped right away
        // instead of waiting in their next collective.
        const fitrun::v1::OutOfMemory oom = events.back().oom();
        (void)table_->PublishAll(entry, std::exchange(events, {}));
        attempts_->OnOutOfMemory(entry, oom);
        break;
      }
      case ReportIngest::Next::kFinished:
        // The rank_finished event goes out before whatever state change it leads to.
        (void)table_->PublishAll(entry, std::exchange(events, {}));
        attempts_->MaybeSucceed(entry, /*deadline_passed=*/false);
        break;
      case ReportIngest::Next::kNothing:
        break;
    }
  }
  (void)table_->PublishAll(entry, std::move(events));
}

}  // namespace fitrun::server
