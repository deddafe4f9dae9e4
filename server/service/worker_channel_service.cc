#include "server/service/worker_channel_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/service/grpc_status.h"

namespace fitrun::server {
namespace {

using fitrun::v1::WorkerCommand;
using fitrun::v1::WorkerReport;

class WorkerStreamReactor;

// The manager's (and the hello watchdog's) handle on a stream: forwards to it until the stream is
// done, then does nothing.
class StreamConnection : public WorkerConnection {
 public:
  explicit StreamConnection(WorkerStreamReactor* reactor) : reactor_(reactor) {}
  void SendStop(const std::string& reason) override;
  // Ends the stream if it has not said hello yet.
  void ExpireUnlessAttached();
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  WorkerStreamReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

// The host part of a gRPC peer ("ipv4:127.0.0.1:50412" -> "ipv4:127.0.0.1").
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos || peer.compare(0, 5, "unix:") == 0 ? peer : peer.substr(0, colon);
}

}  // namespace

class WorkerChannelService::Streams {
 public:
  explicit Streams(Options options) : options_(options) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }
  ~Streams() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    watchdog_.join();
  }

  const Options& options() const { return options_; }

  // A stream from `peer` opened: false when the peer already holds as many without a hello as it may.
  bool Opened(const std::string& peer) {
    absl::MutexLock lock(&mu_);
    int& open = without_hello_[peer];
    if (open >= options_.max_streams_without_hello_per_peer) return false;
    ++open;
    return true;
  }
  // Its hello arrived: it counts for its rank now; false when the rank has as many as it may.
  bool Attached(const std::string& peer, const std::string& rank) {
    absl::MutexLock lock(&mu_);
    ReleaseLocked(&without_hello_, peer);
    int& open = by_rank_[rank];
    if (open >= options_.max_streams_per_rank) return false;
    ++open;
    return true;
  }
  void ClosedWithoutHello(const std::string& peer) {
    absl::MutexLock lock(&mu_);
    ReleaseLocked(&without_hello_, peer);
  }
  void ClosedAttached(const std::string& rank) {
    absl::MutexLock lock(&mu_);
    ReleaseLocked(&by_rank_, rank);
  }
  // Ends the stream at its hello deadline unless it said hello by then.
  void Watch(std::weak_ptr<StreamConnection> connection) {
    absl::MutexLock lock(&mu_);
    deadlines_.emplace_back(absl::Now() + options_.hello_deadline, std::move(connection));
  }

 private:
  static void ReleaseLocked(std::map<std::string, int>* counts, const std::string& key) {
    auto it = counts->find(key);
    if (it != counts->end() && --it->second <= 0) counts->erase(it);
  }

  void WatchdogLoop() {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      // Deadlines are added in order (a fixed delay after now), so the first is the earliest.
      const absl::Time next = deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.front().first;
      const size_t known = deadlines_.size();
      auto woken = [this, known]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || (known == 0 && !deadlines_.empty());
      };
      mu_.AwaitWithDeadline(absl::Condition(&woken), next);
      const absl::Time now = absl::Now();
      std::vector<std::shared_ptr<StreamConnection>> expired;
      while (!deadlines_.empty() && deadlines_.front().first <= now) {
        if (std::shared_ptr<StreamConnection> connection = deadlines_.front().second.lock()) {
          expired.push_back(std::move(connection));
        }
        deadlines_.pop_front();
      }
      mu_.Unlock();  // a stream's own lock is taken next; never inside this one
      for (const std::shared_ptr<StreamConnection>& connection : expired) connection->ExpireUnlessAttached();
      mu_.Lock();
    }
  }

  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, int> without_hello_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> by_rank_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, std::weak_ptr<StreamConnection>>> deadlines_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

namespace {

class WorkerStreamReactor : public grpc::ServerBidiReactor<WorkerReport, WorkerCommand> {
 public:
  WorkerStreamReactor(JobManager* manager, WorkerChannelService::Streams* streams, std::string peer)
      : manager_(manager), streams_(streams), peer_(std::move(peer)),
        connection_(std::make_shared<StreamConnection>(this)) {
    if (!streams_->Opened(peer_)) {
      counted_ = Counted::kNot;
      FinishWhenIdle(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                  absl::StrCat("WorkerChannel: ", peer_, " has ",
                                               streams_->options().max_streams_without_hello_per_peer,
                                               " streams open without a hello, as many as a peer may")));
      return;
    }
    streams_->Watch(connection_);
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
      attached_.store(true);
      rank_ = absl::StrCat(key->job_id, "/", key->attempt, "/", key->rank);
      const bool room = streams_->Attached(peer_, rank_);  // out of the peer's count either way
      counted_ = room ? Counted::kForRank : Counted::kNot;
      if (!room) {
        FinishWhenIdle(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                    absl::StrCat("WorkerChannel: rank ", key->rank, " of ", key->job_id,
                                                 " has as many streams open as a rank may")));
        return;
      }
    } else {
      manager_->OnWorkerReport(*key_, report_);
    }
    StartRead(&report_);
  }

  // The hello watchdog's: ends a stream that has not said hello by its deadline.
  void ExpireUnlessAttached() {
    if (attached_.load()) return;
    FinishWhenIdle(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                absl::StrCat("WorkerChannel: no hello within ",
                                             absl::FormatDuration(streams_->options().hello_deadline))));
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
    if (counted_ == Counted::kWithoutHello) streams_->ClosedWithoutHello(peer_);
    if (counted_ == Counted::kForRank) streams_->ClosedAttached(rank_);
    delete this;
  }

 private:
  // Which of the service's counts the stream is in.
  enum class Counted { kNot, kWithoutHello, kForRank };

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
  WorkerChannelService::Streams* const streams_;
  const std::string peer_;
  const std::shared_ptr<StreamConnection> connection_;
  WorkerReport report_;  // owned by the read in flight; reads are sequential
  std::optional<WorkerKey> key_;
  std::string rank_;
  // Set by the read thread, read by the watchdog's; the counts are the read thread's and OnDone's.
  std::atomic<bool> attached_{false};
  Counted counted_ = Counted::kWithoutHello;

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

void StreamConnection::ExpireUnlessAttached() {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->ExpireUnlessAttached();
}

}  // namespace

WorkerChannelService::WorkerChannelService(JobManager* manager, Options options)
    : manager_(manager), streams_(std::make_unique<Streams>(options)) {}

WorkerChannelService::~WorkerChannelService() = default;

grpc::ServerBidiReactor<WorkerReport, WorkerCommand>* WorkerChannelService::Connect(
    grpc::CallbackServerContext* context) {
  return new WorkerStreamReactor(manager_, streams_.get(), PeerHost(context->peer()));
}

}  // namespace fitrun::server
