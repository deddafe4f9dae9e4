#include "server/core/jobs/job_table.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/contract/log.h"
#include "server/core/jobs/proto_time.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;
using fitrun::v1::JobState;

namespace {

bool TransitionAllowed(JobState from, JobState to) {
  switch (from) {
    case fitrun::v1::JOB_STATE_UNSPECIFIED:
      return to == fitrun::v1::JOB_STATE_QUEUED;
    case fitrun::v1::JOB_STATE_QUEUED:
      return to == fitrun::v1::JOB_STATE_PLANNING || to == fitrun::v1::JOB_STATE_CANCELLED ||
             to == fitrun::v1::JOB_STATE_FAILED;
    case fitrun::v1::JOB_STATE_PLANNING:
      return to == fitrun::v1::JOB_STATE_RUNNING || to == fitrun::v1::JOB_STATE_QUEUED ||
             to == fitrun::v1::JOB_STATE_FAILED || to == fitrun::v1::JOB_STATE_CANCELLED;
    case fitrun::v1::JOB_STATE_RUNNING:
      return to == fitrun::v1::JOB_STATE_SUCCEEDED || to == fitrun::v1::JOB_STATE_FAILED ||
             to == fitrun::v1::JOB_STATE_CANCELLED || to == fitrun::v1::JOB_STATE_RESTARTING;
    case fitrun::v1::JOB_STATE_RESTARTING:
      return to == fitrun::v1::JOB_STATE_PLANNING || to == fitrun::v1::JOB_STATE_FAILED ||
             to == fitrun::v1::JOB_STATE_CANCELLED;
    default:
      return false;
  }
}

}  // namespace

JobTable::JobTable(Options options, JobStore* store, EventHub* hub, CoordinatorMetrics* metrics)
    : options_(std::move(options)),
      store_(store),
      hub_(hub),
      metrics_(metrics),
      open_jobs_(options_.max_open_jobs_per_owner),
      retention_(options_.retain_finished_jobs) {}

bool JobTable::IsTerminal(JobState state) {
  return state == fitrun::v1::JOB_STATE_SUCCEEDED || state == fitrun::v1::JOB_STATE_FAILED ||
         state == fitrun::v1::JOB_STATE_CANCELLED;
}

JobEntry* JobTable::Find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobEntry* JobTable::Find(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

JobEntry& JobTable::Restore(JobRecord record) {
  const std::string id = record.job.id();
  next_submit_order_ = std::max(next_submit_order_, record.submit_order + 1);
  hub_->RestoreSequence(id, record.job.last_sequence());
  JobEntry& entry = jobs_[id];
  entry.record = std::move(record);
  ids_by_order_[entry.record.submit_order] = id;
  if (!IsTerminal(entry.record.job.state())) open_jobs_.Opened(entry.record.job.owner());
  open_jobs_.Remember(entry.record.job);
  metrics_->JobStateChanged(fitrun::v1::JOB_STATE_UNSPECIFIED, entry.record.job.state());
  return entry;
}

void JobTable::RestoreDone(const JobEntry& entry) {
  const Job& job = entry.record.job;
  if (IsTerminal(job.state())) retention_.Ended(job.id(), FromProto(job.finished_at()), entry.record.submit_order);
}

absl::StatusOr<JobEntry*> JobTable::Admit(JobEntry entry, const std::string& reason) {
  const int64_t order = next_submit_order_++;
  const std::string id = absl::StrFormat("j-%06d", order);
  entry.record.submit_order = order;
  entry.record.job.set_id(id);
  JobEntry& stored = jobs_[id] = std::move(entry);
  ids_by_order_[order] = id;
  open_jobs_.Remember(stored.record.job);
  // Durable before it is acknowledged (a job accepted is never dropped): admitting a new job stores
  // it with its first event, and a job the store refused never existed.
  if (absl::Status status = Transition(stored, fitrun::v1::JOB_STATE_QUEUED, reason); !status.ok()) {
    open_jobs_.Forget(stored.record.job);
    jobs_.erase(id);
    ids_by_order_.erase(order);
    return status;
  }
  return &stored;
}

absl::Status JobTable::Transition(JobEntry& entry, JobState to, const std::string& reason) {
  Job& job = entry.record.job;
  const JobState from = job.state();
  if (!TransitionAllowed(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id(), " cannot go from ", JobStateName(from), " to ",
                                                      JobStateName(to)));
  }
  job.set_state(to);
  if (IsTerminal(to)) *job.mutable_finished_at() = ToProto(options_.clock());
  JobEvent event;
  auto* changed = event.mutable_state_changed();
  changed->set_from(from);
  changed->set_to(to);
  changed->set_reason(reason);
  // A new job exists only once stored; a job that exists changes whatever the store says (and the
  // store's failure is logged).
  const bool admitting = from == fitrun::v1::JOB_STATE_UNSPECIFIED;
  if (absl::Status stored = PublishAll(entry, {std::move(event)}, /*only_if_stored=*/admitting); !stored.ok()) {
    job.set_state(from);
    return absl::UnavailableError(absl::StrCat("could not store the job: ", stored.message()));
  }
  metrics_->JobStateChanged(from, to);
  if (IsTerminal(to) && !IsTerminal(from)) {
    const absl::Time created = FromProto(job.created_at());
    const absl::Time finished = FromProto(job.finished_at());
    const absl::Time launched = job.has_started_at() ? FromProto(job.started_at()) : finished;
    metrics_->JobEnded(to, launched - created, finished - created);
  }
  // A job counts against its owner's limit from its admission to its end.
  if (admitting && !IsTerminal(to)) open_jobs_.Opened(job.owner());
  if (!admitting && IsTerminal(to) && !IsTerminal(from)) {
    open_jobs_.Closed(job.owner());
    retention_.Ended(job.id(), FromProto(job.finished_at()), entry.record.submit_order);
  }
  // A new job waits for placement; an ended one frees its owner's room and its devices' queue, and
  // may now be forgotten: the next pass sees to all of it.
  if (admitting || (IsTerminal(to) && !IsTerminal(from))) RequestPass();
  return absl::OkStatus();
}

void JobTable::Publish(JobEntry& entry, JobEvent event) {
  std::vector<JobEvent> events;
  events.push_back(std::move(event));
  (void)PublishAll(entry, std::move(events));
}

absl::Status JobTable::PublishAll(JobEntry& entry, std::vector<JobEvent> events, bool only_if_stored) {
  if (events.empty()) return absl::OkStatus();
  const std::string& job_id = entry.record.job.id();
  const absl::Time now = options_.clock();
  bool persist = false;
  bool rank0_progress = false;
  // Sequence, store, then fan out: a watcher never sees an event the store does not have.
  int64_t sequence = hub_->NextSequence(job_id);
  for (JobEvent& event : events) {
    const std::string kind = EventKind(event);
    if (kind == "state_changed" || kind == "plan_chosen" || kind == "rank_finished") persist = true;
    if (event.has_progress() && event.progress().rank() == 0) rank0_progress = true;
    event.set_job_id(job_id);
    event.set_sequence(sequence++);
    *event.mutable_time() = ToProto(now);
    metrics_->EventRecorded(kind);
  }
  entry.record.job.set_last_sequence(events.back().sequence());
  if (rank0_progress && now - entry.progress_persisted_at >= absl::Seconds(1)) {
    entry.progress_persisted_at = now;
    persist = true;
  }
  // The job, when it changed, in the same commit as its events.
  const absl::Status status = persist ? store_->AppendEventsAndPutJob(events, entry.record) : store_->AppendEvents(events);
  if (!status.ok()) {
    if (only_if_stored) return status;
    // The events still reach live watchers; the gap in the store is reported in the log.
    contract::LogError("could not store events %s/%lld..%lld%s: %s", job_id.c_str(),
                       static_cast<long long>(events.front().sequence()),
                       static_cast<long long>(events.back().sequence()), persist ? " with the job" : "",
                       std::string(status.message()).c_str());
  }
  hub_->Publish(std::move(events));
  return status;
}

void JobTable::Persist(const JobEntry& entry) {
  if (absl::Status status = store_->PutJob(entry.record); !status.ok()) {
    contract::LogError("could not store job %s: %s", entry.record.job.id().c_str(),
                       std::string(status.message()).c_str());
  }
}

std::vector<Job> JobTable::List(const std::vector<JobState>& states) const {
  const std::set<JobState> wanted(states.begin(), states.end());
  std::vector<Job> jobs;
  for (const auto& [order, id] : ids_by_order_) {
    const Job& job = jobs_.at(id).record.job;
    if (wanted.empty() || wanted.count(job.state()) > 0) jobs.push_back(job);
  }
  return jobs;
}

JobTable::Page JobTable::ListPage(const std::vector<JobState>& states, int64_t after_order, int limit,
                                  const std::function<bool(const Job&)>& visible) const {
  limit = std::max(limit, 1);
  const std::set<JobState> wanted(states.begin(), states.end());
  Page page;
  for (auto it = ids_by_order_.upper_bound(after_order); it != ids_by_order_.end(); ++it) {
    const Job& job = jobs_.at(it->second).record.job;
    if ((!wanted.empty() && wanted.count(job.state()) == 0) || !visible(job)) continue;
    if (static_cast<int>(page.jobs.size()) == limit) {
      // The last job returned, not the one found beyond it: the next page starts after it.
      page.next_order = jobs_.at(page.jobs.back().id()).record.submit_order;
      return page;
    }
    page.jobs.push_back(job);
  }
  return page;
}

std::vector<std::string> JobTable::ForgetExcess() {
  const int64_t newest = ids_by_order_.empty() ? 0 : ids_by_order_.rbegin()->first;
  const std::vector<std::string> excess = retention_.TakeExcess([&](const std::string& id) {
    auto it = jobs_.find(id);
    return it == jobs_.end() || (!it->second.active && it->second.record.submit_order != newest);
  });
  std::vector<std::string> forgotten;
  for (const std::string& id : excess) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    open_jobs_.Forget(it->second.record.job);
    ids_by_order_.erase(it->second.record.submit_order);
    jobs_.erase(it);
    hub_->Forget(id);
    forgotten.push_back(id);
  }
  return forgotten;
}

}  // namespace fitrun::server
