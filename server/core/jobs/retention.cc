#include "server/core/jobs/retention.h"

namespace fitrun::server {

void Retention::Ended(const std::string& job_id, absl::Time ended, int64_t submit_order) {
  ended_.emplace(ended, submit_order, job_id);
}

std::vector<std::string> Retention::TakeExcess(const std::function<bool(const std::string&)>& may_forget) {
  std::vector<std::string> forgotten;
  if (retain_ <= 0) return forgotten;
  int64_t excess = static_cast<int64_t>(ended_.size()) - retain_;
  for (auto it = ended_.begin(); excess > 0 && it != ended_.end();) {
    if (!may_forget(std::get<2>(*it))) {
      ++it;
      continue;
    }
    forgotten.push_back(std::get<2>(*it));
    it = ended_.erase(it);
    --excess;
  }
  return forgotten;
}

}  // namespace fitrun::server
