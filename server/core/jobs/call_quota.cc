#include "server/core/jobs/call_quota.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "server/core/errors.h"

namespace fitrun::server {

absl::StatusOr<CallQuota::Ticket> CallQuota::Admit(const std::string& user) {
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  auto [it, added] = buckets_.try_emplace(user);
  Bucket& bucket = it->second;
  if (added) {
    bucket.calls = options_.burst;
  } else if (now > bucket.refilled_at) {
    bucket.calls = std::min(options_.burst, bucket.calls + options_.per_second * absl::ToDoubleSeconds(now - bucket.refilled_at));
  }
  bucket.refilled_at = now;
  const std::string who = user.empty() ? "this user" : user;
  if (bucket.running >= options_.concurrent) {
    return WithReason(absl::ResourceExhaustedError(absl::StrFormat(
                          "%s: %s has %d running, as many as one user may run at once; wait for one to answer",
                          options_.call, who, bucket.running)),
                      options_.reason);
  }
  if (bucket.calls < 1) {
    return WithReason(absl::ResourceExhaustedError(absl::StrFormat(
                          "%s: %s called it more than %.0f times a second (after a burst of %.0f); call it "
                          "again in a moment",
                          options_.call, who, options_.per_second, options_.burst)),
                      options_.reason);
  }
  bucket.calls -= 1;
  ++bucket.running;
  return Ticket(this, user);
}

void CallQuota::Release(const std::string& user) {
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(user);
  if (it != buckets_.end()) --it->second.running;
}

}  // namespace fitrun::server
