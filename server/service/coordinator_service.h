// The Coordinator gRPC service: translates protos and calls the JobManager, nothing more.
// Unary calls finish inline; WatchJob is a ServerWriteReactor that reads the job's events by
// cursor (see WatchJobReactor in the .cc). Thread-safe as the manager is.
#ifndef FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
#define FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_

#include "fitrun/v1/coordinator.grpc.pb.h"
#include "server/core/job_manager.h"

namespace fitrun::server {

class CoordinatorService final : public fitrun::v1::Coordinator::CallbackService {
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
  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* context,
                                        const fitrun::v1::ListDevicesRequest* request,
                                        fitrun::v1::ListDevicesResponse* response) override;

 private:
  JobManager* const manager_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
