#include "server/service/coordinator_service.h"

#include <pthread.h>

#include <algorithm>
#include <deque>
#include <iterator>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <google/protobuf/util/time_util.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "server/core/specs/job_specs.h"
#include "server/watch/watch_cursor.h"
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

// A server stream fed by polling: Pump() asks the subclass for the next message and writes it,
// one write at a time (never with buffer_hint: a hinted write may wait for the next write before it
// completes, while the next write waits for that completion). Anything may call Pump() through a
// Waker at any time, including after the stream is done; such calls are then ignored.
template <typename Message>
class PolledWriteReactor : public grpc::ServerWriteReactor<Message> {
 public:
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away"));
      return;
    }
    AfterWrite();
  }
  void OnCancel() override { FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }
  // Ends the stream before it started, with why.
  void Refuse(const grpc::Status& status) { FinishOnce(status); }
  // Runs when the stream is done (a quota to release).
  void set_on_done(std::function<void()> on_done) { on_done_ = std::move(on_done); }
  void OnDone() override {
    if (on_done_) on_done_();
    BeforeDelete();
    {
      // Unlocked before the delete: the lock's Mutex lives in link_, which the delete may free
      // (when no waker holds the Link any more).
      absl::MutexLock lock(&link_->mu);
      link_->reactor = nullptr;
    }
    delete this;
  }

 protected:
  enum class Step { kWrite, kWait, kFinish };
  // Under mu_: fills `next` and returns kWrite, returns kWait when there is nothing to send yet, or
  // kFinish with the stream's final status.
  virtual Step Next(Message* next, grpc::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Runs once the stream is done, before the reactor is deleted (drop subscriptions here).
  virtual void BeforeDelete() {}
  // A write completed: by default the next one starts at once.
  virtual void AfterWrite() { Pump(); }

  PolledWriteReactor() : link_(std::make_shared<Link>()) { link_->reactor = this; }

  // Something that calls Pump() while the reactor lives, and nothing after.
  std::function<void()> Waker() {
    return [link = link_] {
      absl::MutexLock lock(&link->mu);
      if (link->reactor != nullptr) link->reactor->Pump();
    };
  }

  void Pump() {
    Step step = Step::kWait;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      step = Next(&current_, &status);
      if (step == Step::kWrite) writing_ = true;
      if (step == Step::kFinish) finished_ = true;
    }
    if (step == Step::kWrite) this->StartWrite(&current_);
    if (step == Step::kFinish) this->Finish(status);
  }

  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    this->Finish(status);
  }

  absl::Mutex mu_;

 private:
  struct Link {
    absl::Mutex mu;
    PolledWriteReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };
  const std::shared_ptr<Link> link_;
  std::function<void()> on_done_;
  Message current_;  // owned by the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// What both WatchJob flavours share: the cursor, the subscription that wakes the stream through
// the fan-out thread, and starting (refused at once when the job does not exist).
template <typename Message>
class WatchReactorBase : public PolledWriteReactor<Message> {
 public:
  WatchReactorBase(JobManager* manager, WatchFanout* fanout, std::string job_id, int64_t from_sequence)
      : manager_(manager), fanout_(fanout), job_id_(job_id), cursor_(manager, std::move(job_id), from_sequence) {}

  void Start() {
    absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id_);
    if (!job.ok()) {
      this->FinishOnce(ToGrpcStatus(job.status()));
      return;
    }
    {
      // A job that already ended has no more events past its last one.
      absl::MutexLock lock(&this->mu_);
      if (JobManager::IsTerminal(job->state())) cursor_.EndAt(job->last_sequence());
    }
    subscribed_ = true;
    subscription_ = manager_->events().Subscribe(
        job_id_, [pending = pending_, fanout = fanout_, wake = this->Waker()] { fanout->Schedule(pending, wake); });
    this->Pump();
  }
  // Ends the stream before it starts.

 protected:
  void BeforeDelete() override {
    if (subscribed_) manager_->events().Unsubscribe(subscription_);
  }
  // What arrived during the write goes out through the fan-out thread, which gathers it into one
  // message instead of writing whatever trickled in since.
  void AfterWrite() override { fanout_->Schedule(pending_, this->Waker()); }

  JobManager* const manager_;
  WatchFanout* const fanout_;
  const std::shared_ptr<std::atomic<bool>> pending_ = std::make_shared<std::atomic<bool>>(false);
  const std::string job_id_;
  WatchCursor cursor_;  // guarded by mu_ (Next runs under it)

 private:
  bool subscribed_ = false;
  int64_t subscription_ = 0;
};

// One WatchJob stream: one event per message.
class WatchJobReactor : public WatchReactorBase<JobEvent> {
 public:
  using WatchReactorBase::WatchReactorBase;

 private:
  Step Next(JobEvent* next, grpc::Status* status) override {
    if (pending_.empty()) {
      absl::StatusOr<std::vector<EventHub::EventRef>> events = cursor_.Next(kBatch);
      if (!events.ok()) {
        *status = ToGrpcStatus(events.status());
        return Step::kFinish;
      }
      pending_.assign(events->begin(), events->end());
    }
    if (!pending_.empty()) {
      *next = pending_.front()->event;
      pending_.pop_front();
      return Step::kWrite;
    }
    return cursor_.Done() ? Step::kFinish : Step::kWait;
  }

  static constexpr size_t kBatch = 64;
  std::deque<EventHub::EventRef> pending_ ABSL_GUARDED_BY(mu_);
};

// Appends `value` as a protobuf varint.
void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// One WatchJobEvents stream: every event the watcher has pending in one JobEventBatch message. The
// message is assembled from the events' stored encodings (a JobEventBatch is field 1, repeated,
// length-delimited), so fanning an event out to N watchers serializes it once, not N times.
class WatchJobEventsReactor : public WatchReactorBase<grpc::ByteBuffer> {
 public:
  using WatchReactorBase::WatchReactorBase;

 private:
  Step Next(grpc::ByteBuffer* next, grpc::Status* status) override {
    if (pending_.empty()) {
      absl::StatusOr<std::vector<EventHub::EventRef>> events = cursor_.Next(kMaxEvents);
      if (!events.ok()) {
        *status = ToGrpcStatus(events.status());
        return Step::kFinish;
      }
      pending_.assign(events->begin(), events->end());
    }
    if (pending_.empty()) return cursor_.Done() ? Step::kFinish : Step::kWait;
    auto* bytes = new std::string();
    while (!pending_.empty() &&
           (bytes->empty() || bytes->size() + pending_.front()->serialized.size() + 6 <= kMaxBytes)) {
      const std::string& event = pending_.front()->serialized;
      bytes->push_back(static_cast<char>((1 << 3) | 2));  // events = 1, length-delimited
      AppendVarint(event.size(), bytes);
      bytes->append(event);
      pending_.pop_front();
    }
    grpc::Slice slice(bytes->data(), bytes->size(), [](void* owned) { delete static_cast<std::string*>(owned); },
                      bytes);
    *next = grpc::ByteBuffer(&slice, 1);
    return Step::kWrite;
  }

  // Well under gRPC's default 4 MiB receive limit; one event larger than this still goes alone.
  static constexpr size_t kMaxEvents = 1024;
  static constexpr size_t kMaxBytes = 1 << 20;
  std::deque<EventHub::EventRef> pending_ ABSL_GUARDED_BY(mu_);
};

// One StreamLogs call: sends the file in chunks; when following, the ticker wakes it to look again
// until the attempt has ended and everything written has been sent.
class LogStreamReactor : public PolledWriteReactor<fitrun::v1::LogChunk> {
 public:
  LogStreamReactor(JobManager* manager, LogFollowTicker* ticker, fitrun::v1::StreamLogsRequest request)
      : manager_(manager), ticker_(ticker), request_(std::move(request)) {}

  void Start() {
    absl::StatusOr<JobManager::LogFile> log = manager_->RankLog(request_.job_id(), request_.rank(), request_.attempt());
    if (!log.ok()) {
      FinishOnce(ToGrpcStatus(log.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      log_ = *log;
    }
    if (request_.follow()) {
      ticking_ = true;
      tick_ = ticker_->Add(Waker());
    }
    Pump();
  }

 private:
  Step Next(fitrun::v1::LogChunk* next, grpc::Status* status) override {
    // Whether the attempt still runs is read before the file, so bytes written just before it
    // ended are still sent.
    bool running = false;
    if (request_.follow()) {
      absl::StatusOr<JobManager::LogFile> now = manager_->RankLog(request_.job_id(), request_.rank(), log_.attempt);
      running = now.ok() && now->attempt_running;
    }
    std::string data;
    std::ifstream in(log_.path, std::ios::binary);
    if (in) {
      in.seekg(offset_);
      data.resize(kChunk);
      in.read(data.data(), kChunk);
      data.resize(static_cast<size_t>(in.gcount()));
    }
    if (!data.empty()) {
      offset_ += static_cast<std::streamoff>(data.size());
      next->set_attempt(log_.attempt);
      next->set_rank(request_.rank());
      next->set_data(std::move(data));
      return Step::kWrite;
    }
    *status = grpc::Status::OK;
    return running ? Step::kWait : Step::kFinish;
  }

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
  std::streamoff offset_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

LogFollowTicker::LogFollowTicker() {
  thread_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      auto stopping = [this] { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(250));
      if (stopping_) break;
      std::vector<std::function<void()>> ticks;
      for (const auto& [id, tick] : ticks_) ticks.push_back(tick);
      mu_.Unlock();
      for (const auto& tick : ticks) tick();
      mu_.Lock();
    }
  });
}

LogFollowTicker::~LogFollowTicker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

int64_t LogFollowTicker::Add(std::function<void()> tick) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  ticks_[id] = std::move(tick);
  return id;
}

void LogFollowTicker::Remove(int64_t id) {
  absl::MutexLock lock(&mu_);
  ticks_.erase(id);
}

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

absl::StatusOr<fitrun::v1::Job> CoordinatorService::VisibleJob(const Caller& caller, const std::string& job_id) const {
  absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id);
  if (!job.ok()) return job.status();
  if (!caller.MayAccess(job->owner())) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  return job;
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const fitrun::v1::SubmitJobRequest* request,
                                                        fitrun::v1::SubmitJobResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return Done(context, caller.status());
  if (absl::Status size = CheckSpecSize(*request); !size.ok()) return Done(context, size);
  absl::StatusOr<fitrun::v1::JobSpec> spec = SpecFrom(*request);
  if (!spec.ok()) return Done(context, spec.status());
  absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(*std::move(spec), caller->user, request->request_id());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  return Done(context, job.status());
}

grpc::ServerUnaryReactor* CoordinatorService::PlanJob(grpc::CallbackServerContext* context,
                                                      const fitrun::v1::PlanJobRequest* request,
                                                      fitrun::v1::PlanJobResponse* response) {
  if (absl::StatusOr<Caller> caller = Authenticate(context); !caller.ok()) return Done(context, caller.status());
  if (absl::Status size = CheckSpecSize(*request); !size.ok()) return Done(context, size);
  absl::StatusOr<fitrun::v1::JobSpec> spec = SpecFrom(*request);
  if (!spec.ok()) return Done(context, spec.status());
  auto planned = manager_->DryRunPlan(*std::move(spec));
  if (planned.ok()) {
    *response->mutable_spec() = std::move(planned->first);
    *response->mutable_plan() = std::move(planned->second);
  }
  return Done(context, planned.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const fitrun::v1::GetJobRequest* request,
                                                     fitrun::v1::Job* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return Done(context, caller.status());
  absl::StatusOr<fitrun::v1::Job> job = VisibleJob(*caller, request->job_id());
  if (job.ok()) *response = *std::move(job);
  return Done(context, job.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const fitrun::v1::ListJobsRequest* request,
                                                       fitrun::v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return Done(context, caller.status());
  constexpr int kMaxPageSize = 1000;
  if (request->page_size() < 0) {
    return Done(context, absl::InvalidArgumentError(absl::StrCat("page_size: must be >= 0 (got ", request->page_size(), ")")));
  }
  int64_t after = 0;
  if (!request->page_token().empty() && (!absl::SimpleAtoi(request->page_token(), &after) || after < 1)) {
    return Done(context, absl::InvalidArgumentError("page_token: not one that ListJobs gave"));
  }
  std::vector<fitrun::v1::JobState> states;
  for (int s : request->states()) states.push_back(static_cast<fitrun::v1::JobState>(s));
  const int limit = request->page_size() == 0 ? kMaxPageSize : std::min(request->page_size(), kMaxPageSize);
  JobManager::Page page =
      manager_->ListPage(states, after, limit, [&](const fitrun::v1::Job& job) { return caller->MayAccess(job.owner()); });
  for (fitrun::v1::Job& job : page.jobs) *response->add_jobs() = std::move(job);
  if (page.next_order > 0) response->set_next_page_token(absl::StrCat(page.next_order));
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const fitrun::v1::CancelJobRequest* request,
                                                        fitrun::v1::CancelJobResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return Done(context, caller.status());
  if (absl::StatusOr<fitrun::v1::Job> visible = VisibleJob(*caller, request->job_id()); !visible.ok()) {
    return Done(context, visible.status());
  }
  absl::StatusOr<fitrun::v1::Job> job = manager_->Cancel(request->job_id(), request->reason());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  return Done(context, job.status());
}

grpc::ServerWriteReactor<JobEvent>* CoordinatorService::WatchJob(grpc::CallbackServerContext* context,
                                                                 const fitrun::v1::WatchJobRequest* request) {
  auto* reactor = new WatchJobReactor(manager_, &fanout_, request->job_id(), request->from_sequence());
  if (absl::StatusOr<std::string> user = AdmitStream(context, request->job_id()); !user.ok()) {
    reactor->Refuse(ToGrpcStatus(user.status()));
  } else {
    reactor->set_on_done([this, user = *user] { ReleaseStream(user); });
    reactor->Start();
  }
  return reactor;
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
  } else if (absl::StatusOr<std::string> user = AdmitStream(context, request.job_id()); !user.ok()) {
    reactor->Refuse(ToGrpcStatus(user.status()));
  } else {
    reactor->set_on_done([this, user = *user] { ReleaseStream(user); });
    reactor->Start();
  }
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListDevices(grpc::CallbackServerContext* context,
                                                          const fitrun::v1::ListDevicesRequest* request,
                                                          fitrun::v1::ListDevicesResponse* response) {
  if (absl::StatusOr<Caller> caller = Authenticate(context); !caller.ok()) return Done(context, caller.status());
  for (fitrun::v1::Device& device : manager_->Devices()) *response->add_devices() = std::move(device);
  return Done(context, absl::OkStatus());
}

grpc::ServerWriteReactor<fitrun::v1::LogChunk>* CoordinatorService::StreamLogs(
    grpc::CallbackServerContext* context, const fitrun::v1::StreamLogsRequest* request) {
  auto* reactor = new LogStreamReactor(manager_, &ticker_, *request);
  if (absl::StatusOr<std::string> user = AdmitStream(context, request->job_id()); !user.ok()) {
    reactor->Refuse(ToGrpcStatus(user.status()));
  } else {
    reactor->set_on_done([this, user = *user] { ReleaseStream(user); });
    reactor->Start();
  }
  return reactor;
}

}  // namespace fitrun::server
