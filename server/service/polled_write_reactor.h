// The one shape every server stream of the Coordinator service has: a ServerWriteReactor fed by
// polling. WatchJob, WatchJobEvents and StreamLogs each say only what their next message is.
//
// Thread-safety: Pump() may be called from any thread, through a Waker, at any time, including after
// the stream is done (the call is then ignored); gRPC's callbacks arrive on its threads.
#ifndef FITRUN_SERVER_SERVICE_POLLED_WRITE_REACTOR_H_
#define FITRUN_SERVER_SERVICE_POLLED_WRITE_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace fitrun::server {

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

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_POLLED_WRITE_REACTOR_H_
