// The WorkerChannel gRPC service: one bidirectional stream per rank. The first report must be a
// Hello carrying the job's token; later reports go to the JobManager, and the manager's commands
// (stop) come back down the same stream. Thread-safe as the manager is.
#ifndef FITRUN_SERVER_SERVICE_WORKER_CHANNEL_SERVICE_H_
#define FITRUN_SERVER_SERVICE_WORKER_CHANNEL_SERVICE_H_

#include "fitrun/v1/worker.grpc.pb.h"
#include "server/core/jobs/job_manager.h"

namespace fitrun::server {

class WorkerChannelService final : public fitrun::v1::WorkerChannel::CallbackService {
 public:
  explicit WorkerChannelService(JobManager* manager) : manager_(manager) {}

  grpc::ServerBidiReactor<fitrun::v1::WorkerReport, fitrun::v1::WorkerCommand>* Connect(
      grpc::CallbackServerContext* context) override;

 private:
  JobManager* const manager_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_WORKER_CHANNEL_SERVICE_H_
