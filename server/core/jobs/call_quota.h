// How often, and how many at once, one user may make a costly call. PlanJob is one: it reads the
// spec's files as the user (a ratings file may be a gigabyte), plans under the job manager's lock,
// and may queue memory probes; a user calling it in a loop would otherwise take the daemon from
// everyone else. Each user has a bucket of `burst` calls refilled at `per_second`, and at most
// `concurrent` calls running; past either the call is RESOURCE_EXHAUSTED with reason
// `reason`, naming the limit.
//
// Users are the authenticator's (the token file's lines, or a CA's certificates), so the table of
// them is as bounded as that. Thread-safe.
#ifndef FITRUN_SERVER_CORE_JOBS_CALL_QUOTA_H_
#define FITRUN_SERVER_CORE_JOBS_CALL_QUOTA_H_

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fitrun::server {

class CallQuota {
 public:
  struct Options {
    std::string call = "PlanJob";
    std::string reason = "PLANS_PER_USER_LIMIT";
    double per_second = 20;
    double burst = 40;
    int concurrent = 2;
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };
  explicit CallQuota(Options options) : options_(std::move(options)) {}

  // A call admitted: it counts as running until the ticket is destroyed.
  class Ticket {
   public:
    Ticket(CallQuota* quota, std::string user) : quota_(quota), user_(std::move(user)) {}
    Ticket(Ticket&& other) noexcept : quota_(other.quota_), user_(std::move(other.user_)) { other.quota_ = nullptr; }
    Ticket& operator=(Ticket&&) = delete;
    Ticket(const Ticket&) = delete;
    ~Ticket() {
      if (quota_ != nullptr) quota_->Release(user_);
    }

   private:
    CallQuota* quota_;
    std::string user_;
  };
  absl::StatusOr<Ticket> Admit(const std::string& user);

 private:
  void Release(const std::string& user);

  struct Bucket {
    double calls = 0;
    absl::Time refilled_at;
    int running = 0;
  };
  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_CALL_QUOTA_H_
