// The job manager's table of jobs: every job it knows, by id and in submission order, the one place
// a job's state changes (Transition, which checks the move), and the store and watchers every change
// goes to (events sequenced, stored, then fanned out). Owners' open jobs and ended jobs' retention are
// kept in step with it here.
//
// Thread-safety: none of its own. The manager holds it under its lock (JobManager::mu_); the store,
// the event hub and the metrics guard themselves.
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_TABLE_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/job_store.h"
#include "server/core/jobs/event_hub.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/jobs/open_jobs.h"
#include "server/core/jobs/retention.h"

namespace fitrun::server {

class JobTable {
 public:
  struct Options {
    // Jobs one owner may have queued or running at once; 0: no limit.
    int max_open_jobs_per_owner = 0;
    // Ended jobs kept; older ones are forgotten, in memory and in the store; 0: all.
    int64_t retain_finished_jobs = 0;
    std::function<absl::Time()> clock;
  };
  // `store`, `hub` and `metrics` must outlive the table.
  JobTable(Options options, JobStore* store, EventHub* hub, CoordinatorMetrics* metrics);

  // Whether a state is final (no more events will follow its StateChanged).
  static bool IsTerminal(fitrun::v1::JobState state);

  // ---- the jobs ----
  std::map<std::string, JobEntry>& jobs() { return jobs_; }
  const std::map<std::string, JobEntry>& jobs() const { return jobs_; }
  // nullptr for a job not (or no longer) here.
  JobEntry* Find(const std::string& job_id);
  const JobEntry* Find(const std::string& job_id) const;
  // Job ids in submission order (for paging).
  const std::map<int64_t, std::string>& ids_by_order() const { return ids_by_order_; }
  OpenJobs& open_jobs() { return open_jobs_; }
  // The jobs whose state is in `states` (empty: any), in submission order.
  std::vector<fitrun::v1::Job> List(const std::vector<fitrun::v1::JobState>& states) const;
  // One page of jobs in submission order: those after `after_order` (a page's last job's
  // submit_order) whose state is in `states` (empty: any) and that `visible` accepts, `limit` at
  // most. `next_order` is set to the last one's order when more may follow, else to 0.
  struct Page {
    std::vector<fitrun::v1::Job> jobs;
    int64_t next_order = 0;
  };
  Page ListPage(const std::vector<fitrun::v1::JobState>& states, int64_t after_order, int limit,
                const std::function<bool(const fitrun::v1::Job&)>& visible) const;

  // A job an earlier coordinator stored, back in the table as it was, its events' numbering where
  // the store's stands. Call RestoreDone once whatever its state leads to (a recovery) is done.
  JobEntry& Restore(JobRecord record);
  void RestoreDone(const JobEntry& entry);
  // A new job: `entry` (its record's job filled but for id and order) numbered, stored with its first
  // event (QUEUED, `reason`) and acknowledged, or, when the store refuses it, never here at all.
  absl::StatusOr<JobEntry*> Admit(JobEntry entry, const std::string& reason);

  // ---- changes ----
  // The one place job states change: checks the transition, persists, publishes the event.
  // FAILED_PRECONDITION for a transition not allowed; UNAVAILABLE when a new job (from UNSPECIFIED)
  // could not be stored, which is then not admitted: nothing is published or counted.
  absl::Status Transition(JobEntry& entry, fitrun::v1::JobState to, const std::string& reason);
  void Publish(JobEntry& entry, fitrun::v1::JobEvent event);
  // Sequences, stores (one transaction, with the job when a state change, plan or finish changed
  // it), then fans out events of one job, in order. Returns the store's verdict; with
  // `only_if_stored`, events the store refused are not fanned out.
  absl::Status PublishAll(JobEntry& entry, std::vector<fitrun::v1::JobEvent> events, bool only_if_stored = false);
  void Persist(const JobEntry& entry);
  // Forgets the ended jobs beyond the retention (never one with an attempt, whose ranks may still
  // be stopping, nor the newest job, whose order numbers the next) and returns their ids: their
  // rows are the caller's to delete from the store, outside the manager's lock.
  std::vector<std::string> ForgetExcess();

  // ---- the scheduler's cue ----
  // Whether something changed that the scheduler's next pass must see: a job admitted or ended
  // (an ended one frees its owner's room and its devices' queue, and may now be forgotten; Transition
  // asks for the pass itself), devices freed, a deadline set. The scheduler takes the request.
  void RequestPass() { pass_requested_ = true; }
  bool pass_requested() const { return pass_requested_; }
  bool TakePassRequest() { return std::exchange(pass_requested_, false); }

 private:
  const Options options_;
  JobStore* const store_;
  EventHub* const hub_;
  CoordinatorMetrics* const metrics_;
  std::map<std::string, JobEntry> jobs_;
  std::map<int64_t, std::string> ids_by_order_;
  OpenJobs open_jobs_;
  Retention retention_;
  int64_t next_submit_order_ = 1;
  bool pass_requested_ = false;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_TABLE_H_
