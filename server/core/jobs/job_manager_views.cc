// JobManager, what it shows: jobs one by one, in pages and in lists (the table's), the devices with the ranks holding
// them, an attempt's ranks with their planned and peak memory, their logs and the events. Same class,
// same mutex as job_manager.cc; read-only but for nothing (paging and views change no job).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;
using fitrun::v1::JobState;

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = table_.Find(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return entry->record.job;
}

std::vector<Job> JobManager::List(const std::vector<JobState>& states) {
  absl::MutexLock lock(&mu_);
  return table_.List(states);
}

JobManager::Page JobManager::ListPage(const std::vector<JobState>& states, int64_t after_order, int limit,
                                      const std::function<bool(const Job&)>& visible) {
  absl::MutexLock lock(&mu_);
  return table_.ListPage(states, after_order, limit, visible);
}

std::vector<fitrun::v1::Device> JobManager::Devices() {
  absl::MutexLock lock(&mu_);
  return holders_.Devices(table_);
}

std::vector<fitrun::v1::Device> JobManager::Devices(const std::function<bool(const Job&)>& visible) {
  absl::MutexLock lock(&mu_);
  return DevicesSeenBy(holders_.Devices(table_), table_, visible);
}

absl::StatusOr<std::vector<JobEvent>> JobManager::ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                             int limit) {
  from_sequence = std::max<int64_t>(1, from_sequence);
  EventHub::ReadResult recent = hub_.Read(job_id, from_sequence, limit);
  if (!recent.events.empty() || from_sequence > recent.last_sequence) return std::move(recent.events);
  // Older than the in-memory tail: the store has every event.
  return store_->ReadEvents(job_id, from_sequence, limit);
}

absl::StatusOr<JobManager::LogFile> JobManager::RankLog(const std::string& job_id, int rank, int attempt) {
  absl::MutexLock lock(&mu_);
  return FindRankLog(table_, options_.jobs_dir, job_id, rank, attempt);
}

std::vector<JobManager::RunningJob> JobManager::Running() {
  absl::MutexLock lock(&mu_);
  return RunningJobs(table_, holders_);
}

absl::StatusOr<std::vector<JobManager::RankView>> JobManager::Ranks(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = table_.Find(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return RanksOf(*entry);
}

}  // namespace fitrun::server
