#include "server/service/worker_channel_service.h"

#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/service/grpc_status.h"

namespace fitrun::server {
namespace {

using fitrun::v1::WorkerCommand;
using fitrun::v1::WorkerReport;

class WorkerStreamReactor;

// The manager's handle on a stream: forwards commands until the stream is done, then drops them.
class StreamConnection : public WorkerConnection {
 public:
  explicit StreamConnection(WorkerStreamReactor* reactor) : reactor_(reactor) {}
  void SendStop(const std::string& reason) override;
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  WorkerStreamReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class WorkerStreamReactor : public grpc::ServerBidiReactor<WorkerReport, WorkerCommand> {
 public:
  explicit WorkerStreamReactor(JobManager* manager)
      : manager_(manager), connection_(std::make_shared<StreamConnection>(this)) {
    StartRead(&report_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the worker closed its side (or went away)
      FinishWhenIdle(grpc::Status::OK);
      return;
    }
    if (!key_) {
      if (!report_.has_hello()) {
        FinishWhenIdle(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "report: the first report must be a hello"));
        return;
      }
      absl::StatusOr<WorkerKey> key = manager_->AttachWorker(report_.hello(), connection_);
      if (!key.ok()) {
        FinishWhenIdle(ToGrpcStatus(key.status()));
        return;
      }
      key_ = *key;
    } else {
      manager_->OnWorkerReport(*key_, report_);
    }
    StartRead(&report_);
  }

  void Send(WorkerCommand command) {
    {
      absl::MutexLock lock(&mu_);
      if (finish_status_) return;
      outbox_.push_back(std::move(command));
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) outbox_.clear();
    }
    Pump();
  }

  void OnDone() override {
    connection_->Detach();
    delete this;
  }

 private:
  void FinishWhenIdle(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finish_status_) return;
      finish_status_ = std::move(status);
    }
    Pump();
  }

  // Starts the next write, or finishes once nothing is left to write.
  void Pump() {
    bool write = false;
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!outbox_.empty() && !finish_status_) {
        current_ = std::move(outbox_.front());
        outbox_.pop_front();
        writing_ = write = true;
      } else if (finish_status_) {
        finished_ = finish = true;
        status = *finish_status_;
      }
    }
    if (write) StartWrite(&current_);
    if (finish) Finish(status);
  }

  JobManager* const manager_;
  const std::shared_ptr<StreamConnection> connection_;
  WorkerReport report_;  // owned by the read in flight; reads are sequential
  std::optional<WorkerKey> key_;

  absl::Mutex mu_;
  std::deque<WorkerCommand> outbox_ ABSL_GUARDED_BY(mu_);
  WorkerCommand current_;  // owned by the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
};

void StreamConnection::SendStop(const std::string& reason) {
  WorkerCommand command;
  command.mutable_stop()->set_reason(reason);
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Send(std::move(command));
}

}  // namespace

grpc::ServerBidiReactor<WorkerReport, WorkerCommand>* WorkerChannelService::Connect(
    grpc::CallbackServerContext* context) {
  return new WorkerStreamReactor(manager_);
}

}  // namespace fitrun::server
