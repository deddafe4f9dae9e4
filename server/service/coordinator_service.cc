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

// One WatchJob stream. It keeps a cursor (the next sequence to send) and, whenever it is idle and
// the job has news, reads a few events from the manager (memory tail or store) and writes them one
// at a time. Publishing never waits for it, however slow the client is.
class WatchJobReactor : public grpc::ServerWriteReactor<JobEvent> {
 public:
  WatchJobReactor(JobManager* manager, WatchFanout* fanout, std::string job_id, int64_t from_sequence)
      : manager_(manager),
        fanout_(fanout),
        job_id_(std::move(job_id)),
        next_sequence_(std::max<int64_t>(1, from_sequence)) {}

  void Start() {
    absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id_);
    if (!job.ok()) {
      finished_ = true;
      Finish(ToGrpcStatus(job.status()));
      return;
    }
    // A job that already ended has no more events past its last one.
    if (JobManager::IsTerminal(job->state())) end_sequence_ = job->last_sequence();
    link_ = std::make_shared<Link>();
    link_->reactor = this;
    auto pending = std::make_shared<std::atomic<bool>>(false);
    subscription_ = manager_->events().Subscribe(job_id_, [link = link_, pending, fanout = fanout_] {
      fanout->Schedule(pending, [link] {
        absl::MutexLock lock(&link->mu);
        if (link->reactor != nullptr) link->reactor->Pump();
      });
    });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
      return;
    }
    Pump();
  }

  void OnCancel() override { FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }

  void OnDone() override {
    if (link_ != nullptr) {
      manager_->events().Unsubscribe(subscription_);
      absl::MutexLock lock(&link_->mu);
      link_->reactor = nullptr;
    }
    delete this;
  }

 private:
  // What the hub's listener holds: the reactor until OnDone, nothing after.
  struct Link {
    absl::Mutex mu;
    WatchJobReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  void Pump() {
    bool write = false;
    bool finish = false;
    grpc::Status status = grpc::Status::OK;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (pending_.empty()) {
        absl::StatusOr<std::vector<JobEvent>> events = manager_->ReadEvents(job_id_, next_sequence_, kBatch);
        if (!events.ok()) {
          finished_ = finish = true;
          status = ToGrpcStatus(events.status());
        } else {
          pending_.assign(events->begin(), events->end());
        }
      }
      if (!finish && !pending_.empty()) {
        current_ = std::move(pending_.front());
        pending_.pop_front();
        next_sequence_ = current_.sequence() + 1;
        if (current_.has_state_changed() && JobManager::IsTerminal(current_.state_changed().to())) {
          end_sequence_ = current_.sequence();
        }
        writing_ = write = true;
      } else if (!finish && end_sequence_ && next_sequence_ > *end_sequence_) {
        finished_ = finish = true;
      }
    }
    // One write at a time and never with buffer_hint: a hinted write may wait for the next one
    // before completing, and the next one waits for this completion.
    if (write) StartWrite(&current_);
    if (finish) Finish(status);
  }

  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  static constexpr int kBatch = 64;
  JobManager* const manager_;
  WatchFanout* const fanout_;
  const std::string job_id_;
  std::shared_ptr<Link> link_;
  int64_t subscription_ = 0;

  absl::Mutex mu_;
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> end_sequence_ ABSL_GUARDED_BY(mu_);
  std::deque<JobEvent> pending_ ABSL_GUARDED_BY(mu_);
  JobEvent current_;  // owned by the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// One StreamLogs call: sends the file in chunks; when following, waits for the ticker to look
// again until the attempt has ended and everything written has been sent.
class LogStreamReactor : public grpc::ServerWriteReactor<fitrun::v1::LogChunk> {
 public:
  LogStreamReactor(JobManager* manager, LogFollowTicker* ticker, fitrun::v1::StreamLogsRequest request)
      : manager_(manager), ticker_(ticker), request_(std::move(request)) {}

  void Start() {
    absl::StatusOr<JobManager::LogFile> log = manager_->RankLog(request_.job_id(), request_.rank(), request_.attempt());
    if (!log.ok()) {
      finished_ = true;
      Finish(ToGrpcStatus(log.status()));
      return;
    }
    log_ = *log;
    if (request_.follow()) {
      link_ = std::make_shared<Link>();
      link_->reactor = this;
      tick_ = ticker_->Add([link = link_] {
        absl::MutexLock lock(&link->mu);
        if (link->reactor != nullptr) link->reactor->Pump();
      });
    }
    Pump();
  }

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
    if (link_ != nullptr) {
      ticker_->Remove(tick_);
      absl::MutexLock lock(&link_->mu);
      link_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct Link {
    absl::Mutex mu;
    LogStreamReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  void Pump() {
    bool write = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
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
        current_.set_attempt(log_.attempt);
        current_.set_rank(request_.rank());
        current_.set_data(std::move(data));
        writing_ = write = true;
      } else if (!running) {
        finished_ = finish = true;
      }
    }
    if (write) StartWrite(&current_);
    if (finish) Finish(grpc::Status::OK);
  }

  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  static constexpr size_t kChunk = 64 * 1024;
  JobManager* const manager_;
  LogFollowTicker* const ticker_;
  const fitrun::v1::StreamLogsRequest request_;
  JobManager::LogFile log_;
  std::shared_ptr<Link> link_;
  int64_t tick_ = 0;

  absl::Mutex mu_;
  std::streamoff offset_ ABSL_GUARDED_BY(mu_) = 0;
  fitrun::v1::LogChunk current_;  // owned by the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
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
