// What the benchmark programs share: fitrund as a child process on a state directory of its own,
// and the whole job list through ListJobs' pages.
#ifndef FITRUN_SERVER_BENCH_BENCH_DAEMON_H_
#define FITRUN_SERVER_BENCH_BENCH_DAEMON_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "fitrun/v1/coordinator.grpc.pb.h"

namespace fitrun::server::bench {

std::string ReadFile(const std::string& path);

// fitrund started with `flags` (besides --state_dir and a metrics port of its own), its output
// appended to <state_dir>/fitrund.log. Stopped with SIGTERM when destroyed.
class Daemon {
 public:
  Daemon(const std::string& fitrund, const std::string& state_dir, std::vector<std::string> flags);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // The address it serves once it writes <state_dir>/fitrund.address, or "" if it has not after
  // 30 s or has exited.
  std::string WaitForAddress();
  // SIGKILL, and reaped: it ends with no chance to clean up, as in a crash.
  void Kill();
  pid_t pid() const { return pid_; }

 private:
  const std::string state_dir_;
  pid_t pid_ = -1;
};

// Every job, oldest first, through as many ListJobs pages as it takes; false when a call fails.
// Every job the caller may see; `token`, when fitrund has users, is sent as the bearer token.
bool ListAllJobs(fitrun::v1::Coordinator::Stub& stub, std::vector<fitrun::v1::Job>* jobs,
                 const std::string& token = "");

}  // namespace fitrun::server::bench

#endif  // FITRUN_SERVER_BENCH_BENCH_DAEMON_H_
