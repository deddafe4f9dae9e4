// JobManager, what it shows: jobs one by one, in pages and in lists (the table's), the devices with the ranks holding
// them, an attempt's ranks with their planned and peak memory, their logs and the events. Same class,
// same mutex as job_manager.cc; read-only but for nothing (paging and views change no job).
#include <algorithm>
#include <map>
#include <set>

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
  return DevicesLocked();
}

std::vector<fitrun::v1::Device> JobManager::Devices(const std::function<bool(const Job&)>& visible) {
  absl::MutexLock lock(&mu_);
  std::vector<fitrun::v1::Device> devices = DevicesLocked();
  for (fitrun::v1::Device& device : devices) {
    if (device.job_id().empty()) continue;
    auto holder = table_.jobs().find(device.job_id());
    if (holder != table_.jobs().end() && visible(holder->second.record.job)) continue;
    device.clear_job_id();
    device.clear_rank();
    device.set_held_by_another_user(true);
  }
  return devices;
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
  auto it = table_.jobs().find(job_id);
  if (it == table_.jobs().end()) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  const Job& job = it->second.record.job;
  if (job.attempts() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has not started yet (",
                                                      JobStateName(job.state()), "); it has no logs"));
  }
  const int chosen = attempt > 0 ? attempt : job.attempts();
  if (chosen > job.attempts()) {
    return absl::InvalidArgumentError(absl::StrCat("attempt: job ", job_id, " has ", job.attempts(), " attempt(s)"));
  }
  const int world = job.attempt_history().empty() ? job.plan().device_ids_size()
                                                   : job.attempt_history(job.attempt_history_size() - 1).ranks_size();
  if (rank < 0 || rank >= std::max(1, world)) {
    return absl::InvalidArgumentError(absl::StrCat("rank: job ", job_id, " has ranks 0..", std::max(1, world) - 1));
  }
  LogFile log;
  log.job_dir = JobDir(job_id);
  log.run_as = job.run_as();
  log.attempt = chosen;
  log.rank = rank;
  const auto& active = it->second.active;
  log.attempt_running = active && active->attempt == chosen && !active->ranks.at(rank).exited;
  return log;
}

std::vector<fitrun::v1::Device> JobManager::DevicesLocked() {
  std::vector<fitrun::v1::Device> devices = devices_->Snapshot();
  for (fitrun::v1::Device& device : devices) {
    auto owner = device_owner_.find(device.id());
    if (owner == device_owner_.end()) continue;
    const auto& [job_id, rank] = owner->second;
    device.set_job_id(job_id);
    device.set_rank(rank);
    auto job = table_.jobs().find(job_id);
    if (job == table_.jobs().end() || !job->second.active || rank >= static_cast<int>(job->second.active->ranks.size())) {
      continue;
    }
    if (!job->second.record.job.attempt_history().empty()) {
      device.set_planned_bytes(job->second.record.job.attempt_history().rbegin()->predicted_peak_bytes());
    }
    device.set_peak_bytes(job->second.active->ranks[rank].peak_bytes);
    // A virtual device's inventory does not see its rank's allocations (a GPU's NVML does): what is
    // free is what the rank has not reached.
    if (device.kind() == fitrun::v1::DEVICE_KIND_CPU) {
      device.set_free_bytes(std::max<int64_t>(0, device.total_bytes() - device.peak_bytes()));
    }
  }
  return devices;
}

std::vector<JobManager::RankView> JobManager::RanksLocked(const JobEntry& entry) const {
  const Job& job = entry.record.job;
  if (job.attempt_history().empty()) return {};
  const fitrun::v1::AttemptRecord& record = *job.attempt_history().rbegin();
  const bool live = entry.active.has_value() && entry.active->attempt == record.attempt();
  std::vector<RankView> ranks;
  for (int r = 0; r < record.device_ids_size(); ++r) {
    RankView view;
    view.rank = r;
    view.device_id = record.device_ids(r);
    view.planned_bytes = record.predicted_peak_bytes();
    if (live && r < static_cast<int>(entry.active->ranks.size())) {
      view.peak_bytes = entry.active->ranks[r].peak_bytes;
      view.last_progress = entry.active->ranks[r].last_progress;
    } else {
      view.peak_bytes = record.measured_peak_bytes();  // the attempt's highest, recorded per attempt
    }
    ranks.push_back(std::move(view));
  }
  return ranks;
}

std::vector<JobManager::RunningJob> JobManager::Running() {
  absl::MutexLock lock(&mu_);
  // A running attempt holds its devices until released, so the devices name every such job: a
  // scrape costs the devices, not every job ever stored.
  std::map<int64_t, const JobEntry*> by_order;
  for (const auto& [device, owner] : device_owner_) {
    const JobEntry& entry = table_.jobs().at(owner.first);
    if (entry.active) by_order[entry.record.submit_order] = &entry;
  }
  std::vector<RunningJob> running;
  for (const auto& [order, entry] : by_order) running.push_back({entry->record.job, RanksLocked(*entry)});
  return running;
}

absl::StatusOr<std::vector<JobManager::RankView>> JobManager::Ranks(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = table_.jobs().find(job_id);
  if (it == table_.jobs().end()) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return RanksLocked(it->second);
}

}  // namespace fitrun::server
