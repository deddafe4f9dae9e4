#include "server/core/jobs/open_jobs.h"

#include "absl/strings/str_cat.h"
#include "server/core/errors.h"

namespace fitrun::server {

std::optional<std::string> OpenJobs::EarlierJob(const std::string& owner, const std::string& request_id) const {
  if (request_id.empty()) return std::nullopt;
  auto it = ids_by_request_.find({owner, request_id});
  if (it == ids_by_request_.end()) return std::nullopt;
  return it->second;
}

absl::Status OpenJobs::CheckQuota(const std::string& owner) const {
  if (max_per_owner_ <= 0) return absl::OkStatus();
  auto open = open_jobs_by_owner_.find(owner);
  if (open == open_jobs_by_owner_.end() || open->second < max_per_owner_) return absl::OkStatus();
  return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                        "jobs: ", owner.empty() ? "this user" : owner, " has ", open->second,
                        " jobs queued or running, the limit (--max_jobs_per_user); wait for some to end or cancel them")),
                    "JOBS_PER_USER_LIMIT");
}

void OpenJobs::Remember(const fitrun::v1::Job& job) {
  if (!job.request_id().empty()) ids_by_request_[{job.owner(), job.request_id()}] = job.id();
}

void OpenJobs::Forget(const fitrun::v1::Job& job) {
  if (!job.request_id().empty()) ids_by_request_.erase({job.owner(), job.request_id()});
}

void OpenJobs::Closed(const std::string& owner) {
  auto it = open_jobs_by_owner_.find(owner);
  if (it != open_jobs_by_owner_.end() && --it->second <= 0) open_jobs_by_owner_.erase(it);
}

}  // namespace fitrun::server
