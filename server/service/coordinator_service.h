// The Coordinator gRPC service: translates protos and calls the JobManager, nothing more.
// Unary calls finish inline; WatchJob and WatchJobEvents are ServerWriteReactors that read the
// job's events by cursor (see WatchCursor in the .cc). Thread-safe as the manager is.
#ifndef FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
#define FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "server/core/job_manager.h"

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

// The thread that feeds WatchJob streams. Publishing an event only marks its watchers as having
// news (O(1) each); this thread reads and writes for them, so however many watchers there are
// and however slow they are, ingest never waits on them.
//
// Once woken it waits `coalesce` before running what is queued, so a busy job's events reach each
// watcher a batch per message (at most about one message per watcher per `coalesce`) rather than
// one message per event: the price of a little latency is that fan-out costs grow with watchers
// times batches, not watchers times events.
class WatchFanout {
 public:
  explicit WatchFanout(absl::Duration coalesce = absl::Milliseconds(1));
  ~WatchFanout();
  // Runs `pump` on the fan-out thread soon; repeated calls before it runs collapse into one.
  void Schedule(const std::shared_ptr<std::atomic<bool>>& pending, std::function<void()> pump);

 private:
  const absl::Duration coalesce_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// WatchJobEvents is a raw method: its messages are assembled from the events' stored encodings.
class CoordinatorService final
    : public fitrun::v1::Coordinator::WithRawCallbackMethod_WatchJobEvents<fitrun::v1::Coordinator::CallbackService> {
 public:
  explicit CoordinatorService(JobManager* manager) : manager_(manager) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context, const fitrun::v1::SubmitJobRequest* request,
                                      fitrun::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* PlanJob(grpc::CallbackServerContext* context, const fitrun::v1::PlanJobRequest* request,
                                    fitrun::v1::PlanJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context, const fitrun::v1::GetJobRequest* request,
                                   fitrun::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context, const fitrun::v1::ListJobsRequest* request,
                                     fitrun::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context, const fitrun::v1::CancelJobRequest* request,
                                      fitrun::v1::CancelJobResponse* response) override;
  grpc::ServerWriteReactor<fitrun::v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                           const fitrun::v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchJobEvents(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* context,
                                        const fitrun::v1::ListDevicesRequest* request,
                                        fitrun::v1::ListDevicesResponse* response) override;
  grpc::ServerWriteReactor<fitrun::v1::LogChunk>* StreamLogs(grpc::CallbackServerContext* context,
                                                             const fitrun::v1::StreamLogsRequest* request) override;

 private:
  JobManager* const manager_;
  // Wakes following log streams a few times a second to look for appended bytes.
  LogFollowTicker ticker_;
  WatchFanout fanout_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
