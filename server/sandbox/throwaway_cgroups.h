// For tests run as root: job cgroups of the test's own, under a parent cgroup named for the test,
// its process and a random number (so parallel tests never meet), all killed and removed when the
// object goes. Skips are the caller's: available() says whether the machine let it make them (false
// when not root or no writable memory and pids controllers, with why()).
#ifndef FITRUN_SERVER_SANDBOX_THROWAWAY_CGROUPS_H_
#define FITRUN_SERVER_SANDBOX_THROWAWAY_CGROUPS_H_

#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/sandbox/job_cgroup.h"

namespace fitrun::server {

class ThrowawayCgroups {
 public:
  explicit ThrowawayCgroups(const std::string& stem) {
    options_.parent = absl::StrCat("fitrun-test-", stem, "-", getpid(), "-", std::random_device()() % 1000000);
    options_.coordinator_tag = "fitrund-test";
    if (geteuid() != 0) {
      why_ = "needs root, to make cgroups";
      return;
    }
    absl::StatusOr<std::unique_ptr<JobCgroups>> made = JobCgroups::Create(options_);
    if (!made.ok()) {
      why_ = absl::StrCat("needs writable cgroup memory and pids controllers: ", made.status().message());
      return;
    }
    cgroups_ = *std::move(made);
  }
  ~ThrowawayCgroups() { Clear(); }
  ThrowawayCgroups(const ThrowawayCgroups&) = delete;
  ThrowawayCgroups& operator=(const ThrowawayCgroups&) = delete;

  bool available() const { return cgroups_ != nullptr; }
  const std::string& why() const { return why_; }
  JobCgroups* cgroups() { return cgroups_.get(); }
  // What makes the same JobCgroups again (a restarted coordinator's).
  const JobCgroups::Options& options() const { return options_; }
  // The cgroups still under the test's directory.
  std::vector<std::string> Leftovers() const { return cgroups_ ? cgroups_->List() : std::vector<std::string>{}; }
  // Kills and removes every cgroup left, then the test's directories.
  void Clear() {
    if (!cgroups_) return;
    for (const std::string& name : cgroups_->List()) {
      absl::StatusOr<std::unique_ptr<JobCgroup>> left = cgroups_->Open(name);
      if (!left.ok()) continue;
      (void)(*left)->KillAll();
      (void)(*left)->Remove();
    }
    (void)cgroups_->RemoveDirectories();
    cgroups_.reset();
  }

 private:
  JobCgroups::Options options_;
  std::unique_ptr<JobCgroups> cgroups_;
  std::string why_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SANDBOX_THROWAWAY_CGROUPS_H_
