#ifndef FITRUN_WORKER_REPORT_FAKE_COORDINATOR_H_
#define FITRUN_WORKER_REPORT_FAKE_COORDINATOR_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "fitrun/v1/worker.grpc.pb.h"

namespace fitrun::worker {

// The coordinator's side of WorkerChannel for tests: records every stream's reports and can refuse
// a rank or stop it. Thread-safe.
class FakeCoordinator final : public fitrun::v1::WorkerChannel::Service {
 public:
  // Answer the Hello by ending the stream with PERMISSION_DENIED.
  bool reject = false;
  // Send a StopCommand right after the Hello (`stops_to_send` of them).
  bool stop_after_hello = false;
  int stops_to_send = 1;
  // Send a StopCommand after the first Progress.
  bool stop_after_progress = false;

  grpc::Status Connect(grpc::ServerContext*,
                       grpc::ServerReaderWriter<fitrun::v1::WorkerCommand, fitrun::v1::WorkerReport>*
                           stream) override {
    fitrun::v1::WorkerReport report;
    bool first = true;
    bool stopped = false;
    while (stream->Read(&report)) {
      bool has_progress = report.has_progress();
      {
        // A ReportBatch is recorded as the reports it carries, as the coordinator handles it.
        absl::MutexLock lock(&mu_);
        ++messages_;
        if (report.has_batch()) {
          ++batches_;
          for (const fitrun::v1::WorkerReport& one : report.batch().reports()) {
            reports_.push_back(one);
            has_progress = has_progress || one.has_progress();
          }
        } else {
          reports_.push_back(report);
        }
      }
      if (first && reject) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "bad job token");
      if (!stopped && ((first && stop_after_hello) || (has_progress && stop_after_progress))) {
        fitrun::v1::WorkerCommand command;
        command.mutable_stop()->set_reason("peer rank 1 exited");
        for (int i = 0; i < stops_to_send; ++i) {
          if (stream->Write(command)) {
            absl::MutexLock lock(&mu_);
            ++stops_sent_;
          }
        }
        stopped = true;
      }
      first = false;
    }
    absl::MutexLock lock(&mu_);
    ++streams_closed_by_worker_;
    return grpc::Status::OK;
  }

  // Listens on 127.0.0.1 (port 0: any free port); returns the server, sets *port to the bound one.
  std::unique_ptr<grpc::Server> Serve(int* port, int fixed_port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(fixed_port),
                             grpc::InsecureServerCredentials(), port);
    builder.RegisterService(this);
    return builder.BuildAndStart();
  }

  // Messages read, and how many of them were ReportBatches.
  int messages() const {
    absl::MutexLock lock(&mu_);
    return messages_;
  }
  int batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // Every report received (batches unpacked), in arrival order across streams.
  std::vector<fitrun::v1::WorkerReport> reports() const {
    absl::MutexLock lock(&mu_);
    return reports_;
  }
  // Streams the worker half-closed (WritesDone) before the server ended them.
  int stops_sent() const {
    absl::MutexLock lock(&mu_);
    return stops_sent_;
  }
  int streams_closed_by_worker() const {
    absl::MutexLock lock(&mu_);
    return streams_closed_by_worker_;
  }
  int hellos() const {
    int n = 0;
    for (const fitrun::v1::WorkerReport& r : reports()) n += r.has_hello();
    return n;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<fitrun::v1::WorkerReport> reports_ ABSL_GUARDED_BY(mu_);
  int streams_closed_by_worker_ ABSL_GUARDED_BY(mu_) = 0;
  int stops_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int messages_ ABSL_GUARDED_BY(mu_) = 0;
  int batches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_REPORT_FAKE_COORDINATOR_H_
