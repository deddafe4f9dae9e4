// The WatchJob streams: a job's events read by cursor (server/watch/watch_cursor.h) and woken through
// the fan-out thread (server/watch/watch_fanout.h), one event per message (WatchJob) or every pending
// event in one JobEventBatch assembled from the events' stored encodings (WatchJobEvents).
#ifndef FITRUN_SERVER_SERVICE_WATCH_REACTORS_H_
#define FITRUN_SERVER_SERVICE_WATCH_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "fitrun/v1/coordinator.grpc.pb.h"
#include "server/core/jobs/job_manager.h"
#include "server/service/grpc_status.h"
#include "server/service/polled_write_reactor.h"
#include "server/watch/watch_cursor.h"
#include "server/watch/watch_fanout.h"

namespace fitrun::server {

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
class WatchJobReactor : public WatchReactorBase<fitrun::v1::JobEvent> {
 public:
  using WatchReactorBase::WatchReactorBase;

 private:
  Step Next(fitrun::v1::JobEvent* next, grpc::Status* status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static constexpr size_t kBatch = 64;
  std::deque<EventHub::EventRef> pending_ ABSL_GUARDED_BY(mu_);
};

// One WatchJobEvents stream: every event the watcher has pending in one JobEventBatch message. The
// message is assembled from the events' stored encodings (a JobEventBatch is field 1, repeated,
// length-delimited), so fanning an event out to N watchers serializes it once, not N times.
class WatchJobEventsReactor : public WatchReactorBase<grpc::ByteBuffer> {
 public:
  using WatchReactorBase::WatchReactorBase;

 private:
  Step Next(grpc::ByteBuffer* next, grpc::Status* status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Well under gRPC's default 4 MiB receive limit; one event larger than this still goes alone.
  static constexpr size_t kMaxEvents = 1024;
  static constexpr size_t kMaxBytes = 1 << 20;
  std::deque<EventHub::EventRef> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_WATCH_REACTORS_H_
