// The Coordinator gRPC service: translates protos and calls the JobManager, nothing more. Every
// handler starts with the same step, who calls (Unary, OpenStream); unary calls finish inline, the
// streams are reactors of their own (watch_reactors.h, log_stream.h). Thread-safe as the manager is.
#ifndef FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
#define FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_

#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/core/jobs/call_quota.h"
#include "server/core/jobs/job_manager.h"
#include "server/service/grpc_status.h"
#include "server/service/log_stream.h"
#include "server/service/watch_reactors.h"
#include "server/watch/watch_fanout.h"

namespace fitrun::server {

// WatchJobEvents is a raw method: its messages are assembled from the events' stored encodings.
class CoordinatorService final
    : public fitrun::v1::Coordinator::WithRawCallbackMethod_WatchJobEvents<fitrun::v1::Coordinator::CallbackService> {
 public:
  struct Options {
    WatchFanout::Options fanout;
    // Who may call, and see which jobs; nullptr: everyone is the local admin.
    const Authenticator* authenticator = nullptr;
    // Watch and log streams one user may hold open at once.
    int max_streams_per_user = 1000;
    // Every job runs as its owner's Unix account (fitrund is root and has users): a user without
    // one cannot submit or plan.
    bool run_jobs_as_owners = false;
    // PlanJob per user: how often and how many at once (it reads the spec's files and may queue
    // memory probes).
    CallQuota::Options plan_quota;
  };
  explicit CoordinatorService(JobManager* manager) : CoordinatorService(manager, Options()) {}
  CoordinatorService(JobManager* manager, Options options)
      : manager_(manager),
        authenticator_(options.authenticator),
        run_jobs_as_owners_(options.run_jobs_as_owners),
        max_streams_per_user_(options.max_streams_per_user),
        plan_quota_(options.plan_quota),
        fanout_(options.fanout) {}

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

  WatchFanout::Stats fanout_stats() const { return fanout_.stats(); }

 private:
  // The caller, from the call's bearer token or verified client certificate; UNAUTHENTICATED when a
  // secured fitrund cannot tell.
  absl::StatusOr<Caller> Authenticate(grpc::CallbackServerContext* context) const;
  // A unary call: authenticates, runs `body` as the caller, finishes with its status.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                  const std::function<absl::Status(const Caller&)>& body);
  // A stream of one job's events or logs: authenticates, admits it (AdmitStream), then starts the
  // reactor, or has it refuse with why.
  template <typename Reactor>
  Reactor* OpenStream(grpc::CallbackServerContext* context, const std::string& job_id, Reactor* reactor) {
    if (absl::StatusOr<std::string> user = AdmitStream(context, job_id); !user.ok()) {
      reactor->Refuse(ToGrpcStatus(user.status()));
    } else {
      reactor->set_on_done([this, user = *user] { ReleaseStream(user); });
      reactor->Start();
    }
    return reactor;
  }
  // Admits a watch or log stream of the job: the caller may see it and has a stream to spare (under
  // max_streams_per_user). Returns the caller's name for ReleaseStream when the stream is done.
  absl::StatusOr<std::string> AdmitStream(grpc::CallbackServerContext* context, const std::string& job_id);
  void ReleaseStream(const std::string& user);
  // The job, if the caller may see it; NOT_FOUND otherwise, so another user's job is not revealed.
  absl::StatusOr<fitrun::v1::Job> VisibleJob(const Caller& caller, const std::string& job_id) const;

  JobManager* const manager_;
  // The account the caller's jobs run as ("" when jobs run as fitrund's user); FAILED_PRECONDITION
  // for a caller without one when they must have one.
  absl::StatusOr<std::string> RunAs(const Caller& caller) const;
  const Authenticator* const authenticator_;
  const bool run_jobs_as_owners_;
  const int max_streams_per_user_;
  absl::Mutex streams_mu_;
  std::map<std::string, int> streams_by_user_ ABSL_GUARDED_BY(streams_mu_);
  CallQuota plan_quota_;
  // Wakes following log streams a few times a second to look for appended bytes.
  LogFollowTicker ticker_;
  WatchFanout fanout_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
