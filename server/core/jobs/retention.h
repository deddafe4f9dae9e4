// Which ended jobs a coordinator forgets. It keeps the newest `retain_finished_jobs` of them, by
// when they ended (fitrund --retain_finished_jobs), so the store of a fitrund that runs for months
// stops growing: together with the events one job may keep (ReportIngest::Options), what it holds
// is bounded by what the operator set. Jobs not ended are never forgotten.
//
// Thread-safety: none; the job manager keeps it under its lock.
#ifndef FITRUN_SERVER_CORE_JOBS_RETENTION_H_
#define FITRUN_SERVER_CORE_JOBS_RETENTION_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"

namespace fitrun::server {

class Retention {
 public:
  // 0: every ended job is kept.
  explicit Retention(int64_t retain_finished_jobs) : retain_(retain_finished_jobs) {}

  // A job ended (or was found ended when the coordinator started) at `ended`.
  void Ended(const std::string& job_id, absl::Time ended, int64_t submit_order);

  // The ended jobs beyond the bound, oldest first, that `may_forget` lets go (a job whose ranks are
  // still being stopped is not let go yet; a later call takes it); they are no longer counted here.
  std::vector<std::string> TakeExcess(const std::function<bool(const std::string&)>& may_forget);

  size_t ended() const { return ended_.size(); }

 private:
  const int64_t retain_;
  // (when it ended, its submission order, its id): oldest first.
  std::set<std::tuple<absl::Time, int64_t, std::string>> ended_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_RETENTION_H_
