// The WorkerChannel gRPC service: one bidirectional stream per rank. The first report must be a
// Hello carrying the job's token; later reports go to the JobManager, and the manager's commands
// (stop) come back down the same stream. Thread-safe as the manager is.
//
// Anyone who can connect may open a stream, so what a stream may hold is bounded before it proves
// anything: one without a Hello is ended after Options::hello_deadline, and one peer (a host) may
// have Options::max_streams_without_hello_per_peer of them at once; a rank's token opens at most
// Options::max_streams_per_rank streams for that rank (a reconnecting rank's old stream may linger).
#ifndef FITRUN_SERVER_SERVICE_WORKER_CHANNEL_SERVICE_H_
#define FITRUN_SERVER_SERVICE_WORKER_CHANNEL_SERVICE_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fitrun/v1/worker.grpc.pb.h"
#include "server/core/jobs/job_manager.h"

namespace fitrun::server {

class WorkerChannelService final : public fitrun::v1::WorkerChannel::CallbackService {
 public:
  struct Options {
    absl::Duration hello_deadline = absl::Seconds(10);
    int max_streams_without_hello_per_peer = 16;
    int max_streams_per_rank = 4;
  };
  explicit WorkerChannelService(JobManager* manager) : WorkerChannelService(manager, Options()) {}
  WorkerChannelService(JobManager* manager, Options options);
  ~WorkerChannelService() override;

  grpc::ServerBidiReactor<fitrun::v1::WorkerReport, fitrun::v1::WorkerCommand>* Connect(
      grpc::CallbackServerContext* context) override;

  // The bookkeeping the streams share (limits, the hello watchdog); its own lock.
  class Streams;

 private:
  JobManager* const manager_;
  const std::unique_ptr<Streams> streams_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_WORKER_CHANNEL_SERVICE_H_
