#include "server/service/coordinator_service.h"

#include <deque>
#include <fstream>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/core/job_spec.h"
#include "server/service/grpc_status.h"

namespace fitrun::server {
namespace {

using fitrun::v1::JobEvent;

// A spec from either of a request's sources.
template <typename Request>
absl::StatusOr<fitrun::v1::JobSpec> SpecFrom(const Request& request) {
  switch (request.source_case()) {
    case Request::kSpec: return request.spec();
    case Request::kSpecYaml: return ParseJobSpecYaml(request.spec_yaml());
    default: return absl::InvalidArgumentError("spec: give the job spec as `spec` or as `spec_yaml`");
  }
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
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
    Pump();
  }
  void OnCancel() override { FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }
  void OnDone() override {
    BeforeDelete();
    absl::MutexLock lock(&link_->mu);
    link_->reactor = nullptr;
    delete this;
  }

 protected:
  enum class Step { kWrite, kWait, kFinish };
  // Under mu_: fills `next` and returns kWrite, returns kWait when there is nothing to send yet, or
  // kFinish with the stream's final status.
  virtual Step Next(Message* next, grpc::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Runs once the stream is done, before the reactor is deleted (drop subscriptions here).
  virtual void BeforeDelete() {}

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
  Message current_;  // owned by the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// One WatchJob stream. It keeps a cursor (the next sequence to send) and, whenever it is idle and
// the job has news, reads a few events from the manager (memory tail or store) and writes them one
// at a time. Publishing never waits for it, however slow the client is.
class WatchJobReactor : public PolledWriteReactor<JobEvent> {
 public:
  WatchJobReactor(JobManager* manager, WatchFanout* fanout, std::string job_id, int64_t from_sequence)
      : manager_(manager),
        fanout_(fanout),
        job_id_(std::move(job_id)),
        next_sequence_(std::max<int64_t>(1, from_sequence)) {}

  void Start() {
    absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id_);
    if (!job.ok()) {
      FinishOnce(ToGrpcStatus(job.status()));
      return;
    }
    {
      // A job that already ended has no more events past its last one.
      absl::MutexLock lock(&mu_);
      if (JobManager::IsTerminal(job->state())) end_sequence_ = job->last_sequence();
    }
    auto pending = std::make_shared<std::atomic<bool>>(false);
    subscribed_ = true;
    subscription_ = manager_->events().Subscribe(
        job_id_, [pending, fanout = fanout_, wake = Waker()] { fanout->Schedule(pending, wake); });
    Pump();
  }

 private:
  Step Next(JobEvent* next, grpc::Status* status) override {
    if (pending_.empty()) {
      absl::StatusOr<std::vector<JobEvent>> events = manager_->ReadEvents(job_id_, next_sequence_, kBatch);
      if (!events.ok()) {
        *status = ToGrpcStatus(events.status());
        return Step::kFinish;
      }
      pending_.assign(events->begin(), events->end());
    }
    if (!pending_.empty()) {
      *next = std::move(pending_.front());
      pending_.pop_front();
      next_sequence_ = next->sequence() + 1;
      if (next->has_state_changed() && JobManager::IsTerminal(next->state_changed().to())) {
        end_sequence_ = next->sequence();
      }
      return Step::kWrite;
    }
    if (end_sequence_ && next_sequence_ > *end_sequence_) return Step::kFinish;
    return Step::kWait;
  }

  void BeforeDelete() override {
    if (subscribed_) manager_->events().Unsubscribe(subscription_);
  }

  static constexpr int kBatch = 64;
  JobManager* const manager_;
  WatchFanout* const fanout_;
  const std::string job_id_;
  bool subscribed_ = false;
  int64_t subscription_ = 0;
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> end_sequence_ ABSL_GUARDED_BY(mu_);
  std::deque<JobEvent> pending_ ABSL_GUARDED_BY(mu_);
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

WatchFanout::WatchFanout() {
  thread_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (true) {
      auto ready = [this] { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      std::function<void()> pump = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      pump();
      mu_.Lock();
    }
  });
}

WatchFanout::~WatchFanout() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void WatchFanout::Schedule(const std::shared_ptr<std::atomic<bool>>& pending, std::function<void()> pump) {
  if (pending->exchange(true)) return;  // already queued; that run will see this event too
  absl::MutexLock lock(&mu_);
  queue_.push_back([pending, pump = std::move(pump)] {
    pending->store(false);
    pump();
  });
}

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

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const fitrun::v1::SubmitJobRequest* request,
                                                        fitrun::v1::SubmitJobResponse* response) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = SpecFrom(*request);
  if (!spec.ok()) return Done(context, spec.status());
  absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(*std::move(spec));
  if (job.ok()) *response->mutable_job() = *std::move(job);
  return Done(context, job.status());
}

grpc::ServerUnaryReactor* CoordinatorService::PlanJob(grpc::CallbackServerContext* context,
                                                      const fitrun::v1::PlanJobRequest* request,
                                                      fitrun::v1::PlanJobResponse* response) {
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
  absl::StatusOr<fitrun::v1::Job> job = manager_->Get(request->job_id());
  if (job.ok()) *response = *std::move(job);
  return Done(context, job.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const fitrun::v1::ListJobsRequest* request,
                                                       fitrun::v1::ListJobsResponse* response) {
  std::vector<fitrun::v1::JobState> states;
  for (int s : request->states()) states.push_back(static_cast<fitrun::v1::JobState>(s));
  for (fitrun::v1::Job& job : manager_->List(states)) *response->add_jobs() = std::move(job);
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const fitrun::v1::CancelJobRequest* request,
                                                        fitrun::v1::CancelJobResponse* response) {
  absl::StatusOr<fitrun::v1::Job> job = manager_->Cancel(request->job_id(), request->reason());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  return Done(context, job.status());
}

grpc::ServerWriteReactor<JobEvent>* CoordinatorService::WatchJob(grpc::CallbackServerContext* context,
                                                                 const fitrun::v1::WatchJobRequest* request) {
  auto* reactor = new WatchJobReactor(manager_, &fanout_, request->job_id(), request->from_sequence());
  reactor->Start();
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListDevices(grpc::CallbackServerContext* context,
                                                          const fitrun::v1::ListDevicesRequest* request,
                                                          fitrun::v1::ListDevicesResponse* response) {
  for (fitrun::v1::Device& device : manager_->Devices()) *response->add_devices() = std::move(device);
  return Done(context, absl::OkStatus());
}

grpc::ServerWriteReactor<fitrun::v1::LogChunk>* CoordinatorService::StreamLogs(
    grpc::CallbackServerContext* context, const fitrun::v1::StreamLogsRequest* request) {
  auto* reactor = new LogStreamReactor(manager_, &ticker_, *request);
  reactor->Start();
  return reactor;
}

}  // namespace fitrun::server
