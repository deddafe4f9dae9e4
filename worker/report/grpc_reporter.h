#ifndef FITRUN_WORKER_REPORT_GRPC_REPORTER_H_
#define FITRUN_WORKER_REPORT_GRPC_REPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fitrun/v1/worker.grpc.pb.h"
#include "proto/contract/log.h"
#include "worker/trainer/progress_sink.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace fitrun::worker {

// Reports one rank to the coordinator over WorkerChannel.Connect: a Hello first, then progress,
// log lines, heartbeats in quiet phases and the final RankFinished / RankFailed; receives
// StopCommand.
//
// Reporting never blocks or slows training: the sink methods only push onto a bounded queue (the
// oldest progress and log lines are dropped when it is full; finished/failed reports never are), and
// a writer thread owns the stream, writing everything queued since its last write in one message
// (a ReportBatch), so a burst of reports costs one message and one store transaction. When the coordinator is unreachable or the stream breaks, the
// writer keeps retrying with backoff (sending a new Hello each time) while training goes on. A
// coordinator that ends the stream on purpose (bad token, OK, ...) or that sent a StopCommand is not
// reconnected to.
//
// Thread-safety: every public method may be called from any thread. `on_stop` runs on the reader
// thread and must return quickly.
class GrpcReporter final : public ProgressSink {
 public:
  struct Options {
    std::string coordinator;  // host:port
    // PEM of the CA to verify a TLS coordinator with; empty: plain text.
    std::string tls_ca_pem;
    std::string job_id;
    int attempt = 0;
    int rank = 0;
    int world_size = 1;
    std::string job_token;
    int pid = 0;
    size_t queue_capacity = 1024;
    // Reports queued when the writer gets to them travel together, this many at most to a message
    // (a ReportBatch); 1 sends each alone.
    size_t max_reports_per_message = 256;
    absl::Duration connect_timeout = absl::Seconds(2);
    absl::Duration max_backoff = absl::Seconds(5);
    // A Heartbeat goes out when nothing else was sent for this long; zero disables heartbeats.
    absl::Duration heartbeat_interval = absl::Seconds(2);
  };
  using StopCallback = std::function<void(const std::string& reason)>;

  static absl::StatusOr<std::unique_ptr<GrpcReporter>> Create(Options options, StopCallback on_stop);
  // Shuts down without waiting for anything still queued.
  ~GrpcReporter() override;

  void OnProgress(const StepProgress& progress) override;
  void OnLog(const std::string& text) override;
  void OnCheckpoint(const CheckpointNotice& checkpoint) override;
  // Waits until everything queued has been written to a live stream (or there is no stream).
  void Flush(absl::Duration timeout) override;

  void ReportFinished(const fitrun::v1::RankFinished& finished);
  void ReportFailed(const std::string& reason);
  // The device ran out of memory; like the final reports, never dropped. `oom.rank` is set here.
  void ReportOutOfMemory(const fitrun::v1::OutOfMemory& oom);

  // Writes what is queued, half-closes the stream and waits for the coordinator to close its side
  // (WritesDone + Finish), all within `timeout`; then cancels whatever is left. Idempotent.
  void Shutdown(absl::Duration timeout);

  // Reports dropped because the queue was full or the coordinator refused the stream.
  int64_t dropped() const;

 private:
  using Stream = grpc::ClientReaderWriter<fitrun::v1::WorkerReport, fitrun::v1::WorkerCommand>;

  GrpcReporter(Options options, StopCallback on_stop, std::shared_ptr<grpc::Channel> channel);

  void Enqueue(fitrun::v1::WorkerReport report, bool must_deliver);
  void WriterLoop();
  void ReaderLoop(Stream* stream);
  // Connects and sends the Hello; false when the coordinator cannot be reached.
  bool OpenStream();
  // Ends the current stream; `graceful` half-closes and waits for the server first.
  void CloseStream(bool graceful);
  void Log(contract::LogSeverity severity, const std::string& text);

  const Options options_;
  const StopCallback on_stop_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<fitrun::v1::WorkerChannel::Stub> stub_;

  // Only the writer thread touches these.
  std::unique_ptr<grpc::ClientContext> context_owner_;
  std::unique_ptr<Stream> stream_;
  std::thread reader_;
  bool ever_connected_ = false;
  bool logged_unreachable_ = false;

  mutable absl::Mutex mu_;
  struct Queued {
    fitrun::v1::WorkerReport report;
    bool must_deliver = false;
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;    // a report is being written
  bool connected_ ABSL_GUARDED_BY(mu_) = false;  // a stream is open and its Hello was sent
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;  // the reader saw the server end the stream
  bool no_reconnect_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_received_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // for cancelling from Shutdown
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = 0;  // for heartbeats

  std::thread writer_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_REPORT_GRPC_REPORTER_H_
