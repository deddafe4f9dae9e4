// Who has which jobs open: the request id that makes a submit idempotent per owner, and the number
// of jobs one owner may have queued or running at once. What specs are accepted is admission.h's.
//
// Thread-safety: none of its own; the job manager calls it under its lock.
#ifndef FITRUN_SERVER_CORE_JOBS_OPEN_JOBS_H_
#define FITRUN_SERVER_CORE_JOBS_OPEN_JOBS_H_

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

class OpenJobs {
 public:
  // `max_per_owner`: jobs one owner may have queued or running at once (RESOURCE_EXHAUSTED beyond);
  // 0: no limit.
  explicit OpenJobs(int max_per_owner = 0) : max_per_owner_(max_per_owner) {}

  // The job an earlier submit of `owner` with `request_id` created, when there was one (its answer
  // may have been lost); nullopt for an empty request id.
  std::optional<std::string> EarlierJob(const std::string& owner, const std::string& request_id) const;

  // RESOURCE_EXHAUSTED (reason JOBS_PER_USER_LIMIT) when `owner` has as many jobs open as allowed.
  absl::Status CheckQuota(const std::string& owner) const;

  // A job stored (its request id now names it), its admission undone (the store refused it), a job
  // that counts against its owner until it ends, and its end.
  void Remember(const fitrun::v1::Job& job);
  void Forget(const fitrun::v1::Job& job);
  void Opened(const std::string& owner) { ++open_jobs_by_owner_[owner]; }
  void Closed(const std::string& owner);

 private:
  const int max_per_owner_;
  // Job ids by (owner, request_id), for idempotent submits.
  std::map<std::pair<std::string, std::string>, std::string> ids_by_request_;
  // Jobs not yet ended, by owner (what max_per_owner_ bounds).
  std::map<std::string, int> open_jobs_by_owner_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_OPEN_JOBS_H_
