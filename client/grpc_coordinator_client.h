// CoordinatorApi over gRPC's synchronous stub: one channel to fitrund, one call per method.
#ifndef FITRUN_CLIENT_GRPC_COORDINATOR_CLIENT_H_
#define FITRUN_CLIENT_GRPC_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_api.h"
#include "fitrun/v1/coordinator.grpc.pb.h"

namespace fitrun::client {

// Thread-safe: gRPC's channel and synchronous stub may be called from several threads at once.
class GrpcCoordinatorClient : public CoordinatorApi {
 public:
  struct Options {
    // Any gRPC target: "HOST:PORT", "dns:///host:port", "unix:/path".
    std::string address;
    // For unary calls only (fitrund answers them without waiting for training or memory probes). A
    // watch follows a job for as long as it runs, so it has no deadline.
    absl::Duration rpc_timeout = absl::Seconds(10);
    // For ReadJobEvents: a long job's history is many events, but they come from the store at once,
    // so a read this slow means something is wrong.
    absl::Duration history_timeout = absl::Seconds(60);
    // TLS: a PEM CA file to verify fitrund with (empty: plain text), and for mutual TLS a client
    // certificate and key.
    std::string ca_file;
    std::string cert_file;
    std::string key_file;
    // Sent as "authorization: Bearer <token>" with every call; empty: none.
    std::string token;
  };

  static absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> Create(const Options& options);

  absl::StatusOr<v1::Job> SubmitJob(const std::string& spec_yaml) override;
  absl::StatusOr<v1::PlanJobResponse> PlanJob(const std::string& spec_yaml) override;
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) override;
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const std::vector<v1::JobState>& states) override;
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason) override;
  absl::StatusOr<v1::ListDevicesResponse> ListDevices() override;
  absl::Status WatchJob(const std::string& job_id, int64_t from_sequence,
                        const EventCallback& on_event) override;
  absl::Status ReadJobEvents(const std::string& job_id, int64_t from_sequence, int64_t to_sequence,
                             const EventCallback& on_event) override;
  absl::Status StreamLogs(const std::string& job_id, int rank, bool follow,
                          const LogCallback& on_chunk) override;

  // SubmitJob's tries when fitrund is unreachable (the same request id each time).
  static constexpr int kSubmitAttempts = 4;

 private:
  GrpcCoordinatorClient(const Options& options, std::unique_ptr<v1::Coordinator::Stub> stub)
      : options_(options), stub_(std::move(stub)) {}

  // Sets the unary deadline and the credentials on `context`.
  void PrepareUnary(grpc::ClientContext* context) const;
  // The bearer token, for every call.
  void Authorize(grpc::ClientContext* context) const;

  const Options options_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// grpc::Status to absl::Status, code and message unchanged.
absl::Status ToAbslStatus(const grpc::Status& status);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_GRPC_COORDINATOR_CLIENT_H_
