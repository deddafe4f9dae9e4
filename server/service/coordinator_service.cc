#include "server/service/coordinator_service.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/core/specs/job_specs.h"
#include "server/service/grpc_status.h"

namespace fitrun::server {
namespace {

using fitrun::v1::JobEvent;

// A spec from either of a request's sources.
template <typename Request>
absl::StatusOr<fitrun::v1::JobSpec> SpecFrom(const Request& request) {
  absl::StatusOr<fitrun::v1::JobSpec> spec;
  switch (request.source_case()) {
    case Request::kSpec: spec = request.spec(); break;
    case Request::kSpecYaml: spec = ParseJobSpecYaml(request.spec_yaml()); break;
    default: return absl::InvalidArgumentError("spec: give the job spec as `spec` or as `spec_yaml`");
  }
  if (!spec.ok()) return spec;
  if (absl::Status s = ResolveClientPaths(*spec, request.client_dir()); !s.ok()) return s;
  return spec;
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  AddErrorDetails(context, status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The largest spec fitrund parses: a spec is a screenful of YAML; a megabyte is a mistake or worse.
constexpr size_t kMaxSpecBytes = 64 << 10;

template <typename Request>
absl::Status CheckSpecSize(const Request& request) {
  const size_t bytes = request.source_case() == Request::kSpecYaml ? request.spec_yaml().size()
                                                                   : request.spec().ByteSizeLong();
  if (bytes <= kMaxSpecBytes) return absl::OkStatus();
  return WithReason(absl::ResourceExhaustedError(absl::StrCat("spec: ", bytes, " bytes, over the limit of ",
                                                              kMaxSpecBytes, " bytes a spec may have")),
                    "SPEC_SIZE_LIMIT");
}

}  // namespace

absl::StatusOr<Caller> CoordinatorService::Authenticate(grpc::CallbackServerContext* context) const {
  if (authenticator_ == nullptr) return Caller{"local", true};
  std::string token;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    absl::string_view rest = value;
    if (!absl::ConsumePrefix(&rest, "Bearer ")) {
      return absl::UnauthenticatedError("the authorization header must be 'Bearer <token>'");
    }
    token = std::string(rest);
  }
  std::string certificate_name;
  const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
      certificate_name.assign(name.data(), name.size());
    }
  }
  return authenticator_->Identify(token, certificate_name);
}

grpc::ServerUnaryReactor* CoordinatorService::Unary(grpc::CallbackServerContext* context,
                                                    const std::function<absl::Status(const Caller&)>& body) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  return Done(context, caller.ok() ? body(*caller) : caller.status());
}

absl::StatusOr<std::string> CoordinatorService::AdmitStream(grpc::CallbackServerContext* context,
                                                             const std::string& job_id) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  absl::Status admitted = caller.ok() ? VisibleJob(*caller, job_id).status() : caller.status();
  if (admitted.ok()) {
    absl::MutexLock lock(&streams_mu_);
    int& open = streams_by_user_[caller->user];
    if (open >= max_streams_per_user_) {
      admitted = WithReason(absl::ResourceExhaustedError(absl::StrCat(
                                "watchers: ", caller->user, " has ", open, " watch and log streams open, the limit ",
                                "(--max_streams_per_user); close some first")),
                            "STREAMS_PER_USER_LIMIT");
    } else {
      ++open;
    }
  }
  AddErrorDetails(context, admitted);
  if (!admitted.ok()) return admitted;
  return caller->user;
}

void CoordinatorService::ReleaseStream(const std::string& user) {
  absl::MutexLock lock(&streams_mu_);
  if (--streams_by_user_[user] <= 0) streams_by_user_.erase(user);
}

absl::StatusOr<std::string> CoordinatorService::RunAs(const Caller& caller) const {
  if (!run_jobs_as_owners_) return std::string();
  if (caller.unix_account.empty()) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "user ", caller.user, " has no Unix account: fitrund runs every job as its owner's "
                          "account; an operator adds one as the fourth field of the user's line in --auth_tokens "
                          "(or starts fitrund with --unix_accounts=same_name)")),
                      "NO_UNIX_ACCOUNT");
  }
  return caller.unix_account;
}

absl::StatusOr<fitrun::v1::Job> CoordinatorService::VisibleJob(const Caller& caller, const std::string& job_id) const {
  absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id);
  if (!job.ok()) return job.status();
  // Word for word what a job that does not exist gets, so another user's job is not revealed.
  if (!caller.MayAccess(job->owner())) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return job;
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const fitrun::v1::SubmitJobRequest* request,
                                                        fitrun::v1::SubmitJobResponse* response) {
  return Unary(context, [&](const Caller& caller) -> absl::Status {
    if (absl::Status size = CheckSpecSize(*request); !size.ok()) return size;
    absl::StatusOr<fitrun::v1::JobSpec> spec = SpecFrom(*request);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::string> run_as = RunAs(caller);
    if (!run_as.ok()) return run_as.status();
    absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(*std::move(spec), caller.user, request->request_id(), *run_as);
    if (job.ok()) *response->mutable_job() = *std::move(job);
    return job.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::PlanJob(grpc::CallbackServerContext* context,
                                                      const fitrun::v1::PlanJobRequest* request,
                                                      fitrun::v1::PlanJobResponse* response) {
  return Unary(context, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<CallQuota::Ticket> admitted = plan_quota_.Admit(caller.user);
    if (!admitted.ok()) return admitted.status();
    if (absl::Status size = CheckSpecSize(*request); !size.ok()) return size;
    absl::StatusOr<fitrun::v1::JobSpec> spec = SpecFrom(*request);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::string> run_as = RunAs(caller);
    if (!run_as.ok()) return run_as.status();
    auto planned = manager_->DryRunPlan(*std::move(spec), *run_as);
    if (!planned.ok()) return planned.status();
    *response->mutable_spec() = std::move(planned->first);
    *response->mutable_plan() = std::move(planned->second);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const fitrun::v1::GetJobRequest* request,
                                                     fitrun::v1::Job* response) {
  return Unary(context, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<fitrun::v1::Job> job = VisibleJob(caller, request->job_id());
    if (job.ok()) *response = *std::move(job);
    return job.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const fitrun::v1::ListJobsRequest* request,
                                                       fitrun::v1::ListJobsResponse* response) {
  return Unary(context, [&](const Caller& caller) -> absl::Status {
    constexpr int kMaxPageSize = 1000;
    if (request->page_size() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("page_size: must be >= 0 (got ", request->page_size(), ")"));
    }
    int64_t after = 0;
    if (!request->page_token().empty() && (!absl::SimpleAtoi(request->page_token(), &after) || after < 1)) {
      return absl::InvalidArgumentError("page_token: not one that ListJobs gave");
    }
    std::vector<fitrun::v1::JobState> states;
    for (int s : request->states()) states.push_back(static_cast<fitrun::v1::JobState>(s));
    const int limit = request->page_size() == 0 ? kMaxPageSize : std::min(request->page_size(), kMaxPageSize);
    JobManager::Page page = manager_->ListPage(
        states, after, limit, [&](const fitrun::v1::Job& job) { return caller.MayAccess(job.owner()); });
    for (fitrun::v1::Job& job : page.jobs) *response->add_jobs() = std::move(job);
    if (page.next_order > 0) response->set_next_page_token(absl::StrCat(page.next_order));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const fitrun::v1::CancelJobRequest* request,
                                                        fitrun::v1::CancelJobResponse* response) {
  return Unary(context, [&](const Caller& caller) -> absl::Status {
    if (absl::Status visible = VisibleJob(caller, request->job_id()).status(); !visible.ok()) return visible;
    absl::StatusOr<fitrun::v1::Job> job = manager_->Cancel(request->job_id(), request->reason());
    if (job.ok()) *response->mutable_job() = *std::move(job);
    return job.status();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ListDevices(grpc::CallbackServerContext* context,
                                                          const fitrun::v1::ListDevicesRequest* request,
                                                          fitrun::v1::ListDevicesResponse* response) {
  return Unary(context, [&](const Caller& caller) -> absl::Status {
    const auto visible = [&caller](const fitrun::v1::Job& job) { return caller.MayAccess(job.owner()); };
    for (fitrun::v1::Device& device : manager_->Devices(visible)) *response->add_devices() = std::move(device);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<JobEvent>* CoordinatorService::WatchJob(grpc::CallbackServerContext* context,
                                                                 const fitrun::v1::WatchJobRequest* request) {
  return OpenStream(context, request->job_id(),
                    new WatchJobReactor(manager_, &fanout_, request->job_id(), request->from_sequence()));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CoordinatorService::WatchJobEvents(grpc::CallbackServerContext* context,
                                                                               const grpc::ByteBuffer* raw_request) {
  // A raw method (its responses are assembled from stored bytes), so the request is parsed here.
  fitrun::v1::WatchJobRequest request;
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (raw_request->Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  const bool parsed = request.ParseFromString(bytes);
  auto* reactor = new WatchJobEventsReactor(manager_, &fanout_, request.job_id(), request.from_sequence());
  if (!parsed) {
    reactor->Refuse(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: not a WatchJobRequest"));
    return reactor;
  }
  return OpenStream(context, request.job_id(), reactor);
}

grpc::ServerWriteReactor<fitrun::v1::LogChunk>* CoordinatorService::StreamLogs(
    grpc::CallbackServerContext* context, const fitrun::v1::StreamLogsRequest* request) {
  return OpenStream(context, request->job_id(), new LogStreamReactor(manager_, &ticker_, *request));
}

}  // namespace fitrun::server
