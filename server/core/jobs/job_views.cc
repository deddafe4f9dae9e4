#include "server/core/jobs/job_views.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/jobs/job_directory.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

using fitrun::v1::Job;

std::vector<RankView> RanksOf(const JobEntry& entry) {
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

std::vector<RunningJob> RunningJobs(const JobTable& table, const DeviceHolders& holders) {
  std::map<int64_t, const JobEntry*> by_order;
  for (const std::string& job_id : holders.HoldingJobs()) {
    const JobEntry* entry = table.Find(job_id);
    if (entry != nullptr && entry->active) by_order[entry->record.submit_order] = entry;
  }
  std::vector<RunningJob> running;
  for (const auto& [order, entry] : by_order) running.push_back({entry->record.job, RanksOf(*entry)});
  return running;
}

absl::StatusOr<RankLogFile> FindRankLog(const JobTable& table, const std::string& jobs_dir, const std::string& job_id,
                                        int rank, int attempt) {
  const JobEntry* entry = table.Find(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  const Job& job = entry->record.job;
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
  RankLogFile log;
  log.job_dir = JobDirectoryPath(jobs_dir, job_id);
  log.run_as = job.run_as();
  log.attempt = chosen;
  log.rank = rank;
  const auto& active = entry->active;
  log.attempt_running = active && active->attempt == chosen && !active->ranks.at(rank).exited;
  return log;
}

std::vector<fitrun::v1::Device> DevicesSeenBy(std::vector<fitrun::v1::Device> devices, const JobTable& table,
                                              const std::function<bool(const Job&)>& visible) {
  for (fitrun::v1::Device& device : devices) {
    if (device.job_id().empty()) continue;
    const JobEntry* holder = table.Find(device.job_id());
    if (holder != nullptr && visible(holder->record.job)) continue;
    device.clear_job_id();
    device.clear_rank();
    device.set_held_by_another_user(true);
  }
  return devices;
}

}  // namespace fitrun::server
