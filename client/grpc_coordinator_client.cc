#include "client/grpc_coordinator_client.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace fitrun::client {

absl::Status ToAbslStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> GrpcCoordinatorClient::Create(
    const Options& options) {
  if (absl::StripAsciiWhitespace(options.address).empty()) {
    return absl::InvalidArgumentError(
        "--coordinator: empty address (want HOST:PORT, e.g. 127.0.0.1:7070)");
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("rpc_timeout: must be positive");
  }
  if (options.history_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("history_timeout: must be positive");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.ca_file.empty() || !options.cert_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    for (const auto& [flag, path, pem] : {std::tuple<const char*, const std::string&, std::string*>{
                                              "--ca", options.ca_file, &ssl.pem_root_certs},
                                          {"--cert", options.cert_file, &ssl.pem_cert_chain},
                                          {"--key", options.key_file, &ssl.pem_private_key}}) {
      if (path.empty()) continue;
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
      *pem = text.str();
    }
    if (ssl.pem_cert_chain.empty() != ssl.pem_private_key.empty()) {
      return absl::InvalidArgumentError("--cert and --key: give both, or neither");
    }
    credentials = grpc::SslCredentials(ssl);
  }
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(options.address, credentials);
  return std::unique_ptr<GrpcCoordinatorClient>(
      new GrpcCoordinatorClient(options, v1::Coordinator::NewStub(channel)));
}

void GrpcCoordinatorClient::Authorize(grpc::ClientContext* context) const {
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
}

void GrpcCoordinatorClient::PrepareUnary(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options_.rpc_timeout));
  Authorize(context);
}

namespace {

// Where this client runs: the spec's relative paths mean paths from here.
std::string WorkingDirectory() {
  char buffer[4096];
  return getcwd(buffer, sizeof(buffer)) != nullptr ? std::string(buffer) : std::string();
}

// 128 random bits in hex: a submit's identity across its retries.
std::string NewRequestId() {
  unsigned char bytes[16] = {};
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    const uint64_t fallback = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^ static_cast<uint64_t>(getpid());
    std::memcpy(bytes, &fallback, sizeof(fallback));
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace

absl::StatusOr<v1::Job> GrpcCoordinatorClient::SubmitJob(const std::string& spec_yaml) {
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec_yaml);
  request.set_client_dir(WorkingDirectory());
  // A submit whose answer is lost is retried with the same request id, so it never makes two jobs.
  request.set_request_id(NewRequestId());
  absl::Duration backoff = absl::Milliseconds(200);
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    PrepareUnary(&context);
    v1::SubmitJobResponse response;
    const absl::Status status = ToAbslStatus(stub_->SubmitJob(&context, request, &response));
    if (status.ok()) return std::move(*response.mutable_job());
    if (!absl::IsUnavailable(status) || attempt == kSubmitAttempts) return status;
    absl::SleepFor(backoff);
    backoff *= 2;
  }
}

absl::StatusOr<v1::PlanJobResponse> GrpcCoordinatorClient::PlanJob(const std::string& spec_yaml) {
  grpc::ClientContext context;
  PrepareUnary(&context);
  v1::PlanJobRequest request;
  request.set_spec_yaml(spec_yaml);
  request.set_client_dir(WorkingDirectory());
  v1::PlanJobResponse response;
  if (absl::Status status = ToAbslStatus(stub_->PlanJob(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return response;
}

absl::StatusOr<v1::Job> GrpcCoordinatorClient::GetJob(const std::string& job_id) {
  grpc::ClientContext context;
  PrepareUnary(&context);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job response;
  if (absl::Status status = ToAbslStatus(stub_->GetJob(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return response;
}

absl::StatusOr<v1::ListJobsResponse> GrpcCoordinatorClient::ListJobs(const std::vector<v1::JobState>& states) {
  v1::ListJobsRequest request;
  for (v1::JobState state : states) request.add_states(state);
  // Every page, one after the other.
  v1::ListJobsResponse all;
  do {
    grpc::ClientContext context;
    PrepareUnary(&context);
    v1::ListJobsResponse page;
    if (absl::Status status = ToAbslStatus(stub_->ListJobs(&context, request, &page)); !status.ok()) return status;
    for (v1::Job& job : *page.mutable_jobs()) *all.add_jobs() = std::move(job);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<v1::Job> GrpcCoordinatorClient::CancelJob(const std::string& job_id,
                                                         const std::string& reason) {
  grpc::ClientContext context;
  PrepareUnary(&context);
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  v1::CancelJobResponse response;
  if (absl::Status status = ToAbslStatus(stub_->CancelJob(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return std::move(*response.mutable_job());
}

absl::StatusOr<v1::ListDevicesResponse> GrpcCoordinatorClient::ListDevices() {
  grpc::ClientContext context;
  PrepareUnary(&context);
  v1::ListDevicesRequest request;
  v1::ListDevicesResponse response;
  if (absl::Status status = ToAbslStatus(stub_->ListDevices(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return response;
}

absl::Status GrpcCoordinatorClient::WatchJob(const std::string& job_id, int64_t from_sequence,
                                             const EventCallback& on_event) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_from_sequence(from_sequence);
  // The batched stream: one message carries every event the coordinator had pending for us.
  std::unique_ptr<grpc::ClientReader<v1::JobEventBatch>> reader = stub_->WatchJobEvents(&context, request);
  v1::JobEventBatch batch;
  while (reader->Read(&batch)) {
    for (const v1::JobEvent& event : batch.events()) on_event(event);
  }
  return ToAbslStatus(reader->Finish());
}

absl::Status GrpcCoordinatorClient::ReadJobEvents(const std::string& job_id, int64_t from_sequence,
                                                  int64_t to_sequence, const EventCallback& on_event) {
  if (from_sequence > to_sequence) return absl::OkStatus();
  grpc::ClientContext context;
  Authorize(&context);
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.history_timeout));
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_from_sequence(from_sequence);
  std::unique_ptr<grpc::ClientReader<v1::JobEventBatch>> reader = stub_->WatchJobEvents(&context, request);
  v1::JobEventBatch batch;
  bool reached = false;
  while (!reached && reader->Read(&batch)) {
    for (const v1::JobEvent& event : batch.events()) {
      // Past the end (the store lost the last event, or the batch ran on): nothing more is wanted.
      if (event.sequence() > to_sequence) {
        reached = true;
        break;
      }
      on_event(event);
      const int64_t covered = event.has_missed() ? std::max(event.sequence(), event.missed().last_sequence())
                                                 : event.sequence();
      if (covered >= to_sequence) {
        reached = true;
        break;
      }
    }
  }
  if (reached) {
    // Our own cancellation, not a failure: Finish reports it as CANCELLED.
    context.TryCancel();
    (void)reader->Finish();
    return absl::OkStatus();
  }
  return ToAbslStatus(reader->Finish());
}

absl::Status GrpcCoordinatorClient::StreamLogs(const std::string& job_id, int rank, bool follow,
                                               const LogCallback& on_chunk) {
  grpc::ClientContext context;
  Authorize(&context);
  if (!follow) context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(options_.rpc_timeout));
  v1::StreamLogsRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  request.set_follow(follow);
  std::unique_ptr<grpc::ClientReader<v1::LogChunk>> reader = stub_->StreamLogs(&context, request);
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) on_chunk(chunk);
  return ToAbslStatus(reader->Finish());
}

}  // namespace fitrun::client
