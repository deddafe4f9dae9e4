// StreamLogs: a rank's log file sent in chunks and, when following, looked at again a few times a
// second (one ticker thread for every following stream) until its attempt has ended and everything
// written has been sent.
#ifndef FITRUN_SERVER_SERVICE_LOG_STREAM_H_
#define FITRUN_SERVER_SERVICE_LOG_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "server/core/jobs/job_manager.h"
#include "server/sandbox/owned_directory.h"
#include "server/service/polled_write_reactor.h"

namespace fitrun::server {

// One thread that periodically calls every registered callback; log streams that follow a file
// register here instead of each holding a thread.
class LogFollowTicker {
 public:
  LogFollowTicker();
  ~LogFollowTicker();
  int64_t Add(std::function<void()> tick);
  void Remove(int64_t id);

 private:
  absl::Mutex mu_;
  std::map<int64_t, std::function<void()>> ticks_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// One StreamLogs call: sends the file in chunks; when following, the ticker wakes it to look again
// until the attempt has ended and everything written has been sent.
class LogStreamReactor : public PolledWriteReactor<fitrun::v1::LogChunk> {
 public:
  LogStreamReactor(JobManager* manager, LogFollowTicker* ticker, fitrun::v1::StreamLogsRequest request)
      : manager_(manager), ticker_(ticker), request_(std::move(request)) {}

  void Start();

 private:
  Step Next(fitrun::v1::LogChunk* next, grpc::Status* status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void BeforeDelete() override {
    if (ticking_) ticker_->Remove(tick_);
  }

  static constexpr size_t kChunk = 64 * 1024;
  JobManager* const manager_;
  LogFollowTicker* const ticker_;
  const fitrun::v1::StreamLogsRequest request_;
  bool ticking_ = false;
  int64_t tick_ = 0;
  JobManager::LogFile log_ ABSL_GUARDED_BY(mu_);
  std::optional<UntrustedFile> file_ ABSL_GUARDED_BY(mu_);
  int64_t offset_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_LOG_STREAM_H_
