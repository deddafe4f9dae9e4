// The Coordinator gRPC service: translates protos and calls the JobManager, nothing more.
// Unary calls finish inline; WatchJob and WatchJobEvents are ServerWriteReactors that read the
// job's events by cursor (see WatchCursor in the .cc). Thread-safe as the manager is.
#ifndef FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
#define FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/core/job_manager.h"

namespace fitrun::server {

// One thread that periodically calls every registered callback; log streams that follow a file
// register here instead of each holding a thread.
class LogFollowTicker {
 public:
  LogFollowTicker();
  ~LogFollowTicker();
  int64_t Add(std::function<void()> tick);
  void Remove(int64_t id);

 private:
  absl::Mutex mu_;
  std::map<int64_t, std::function<void()>> ticks_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The thread (by default one) that feeds WatchJob streams. Publishing an event only marks its
// watchers as having news (O(1) each); this thread reads and writes for them, so however many
// watchers there are and however slow they are, ingest never waits on them.
//
// Passes are at least `window` apart: a wake that comes when the last pass started longer ago than
// that runs at once (an idle job's event goes straight out), and wakes during the window wait for
// its end, so a busy job's events reach each watcher a batch per message (at most about one message
// per watcher per `window`) rather than one message per event. Fan-out costs then grow with
// watchers times passes, not watchers times events. `threads` > 1 splits each pass's watchers
// between that many threads.
class WatchFanout {
 public:
  struct Options {
    absl::Duration window = absl::Milliseconds(1);
    // Wait the whole window after every wake, even after an idle spell (the older behaviour; for
    // comparison in the benchmark).
    bool always_wait = false;
    int threads = 1;
  };
  // Timing counters, read by the benchmark.
  struct Stats {
    int64_t passes = 0;
    int64_t pumps = 0;         // watcher wakes run (each reads the tail and may start one write)
    absl::Duration pumping;    // time spent running them, summed over threads
  };
  explicit WatchFanout(Options options);
  WatchFanout() : WatchFanout(Options{}) {}
  ~WatchFanout();
  // Runs `pump` on the fan-out thread soon; repeated calls before it runs collapse into one.
  void Schedule(const std::shared_ptr<std::atomic<bool>>& pending, std::function<void()> pump);
  Stats stats() const;

 private:
  void Run();

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // The pass being run: wakes not yet claimed by a thread start at next_.
  std::vector<std::function<void()>> pass_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_pass_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// WatchJobEvents is a raw method: its messages are assembled from the events' stored encodings.
class CoordinatorService final
    : public fitrun::v1::Coordinator::WithRawCallbackMethod_WatchJobEvents<fitrun::v1::Coordinator::CallbackService> {
 public:
  struct Options {
    WatchFanout::Options fanout;
    // Who may call, and see which jobs; nullptr: everyone is the local admin.
    const Authenticator* authenticator = nullptr;
    // Watch and log streams one user may hold open at once.
    int max_streams_per_user = 1000;
  };
  explicit CoordinatorService(JobManager* manager) : CoordinatorService(manager, Options()) {}
  CoordinatorService(JobManager* manager, Options options)
      : manager_(manager),
        authenticator_(options.authenticator),
        max_streams_per_user_(options.max_streams_per_user),
        fanout_(options.fanout) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context, const fitrun::v1::SubmitJobRequest* request,
                                      fitrun::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* PlanJob(grpc::CallbackServerContext* context, const fitrun::v1::PlanJobRequest* request,
                                    fitrun::v1::PlanJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context, const fitrun::v1::GetJobRequest* request,
                                   fitrun::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context, const fitrun::v1::ListJobsRequest* request,
                                     fitrun::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context, const fitrun::v1::CancelJobRequest* request,
                                      fitrun::v1::CancelJobResponse* response) override;
  grpc::ServerWriteReactor<fitrun::v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                           const fitrun::v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchJobEvents(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* context,
                                        const fitrun::v1::ListDevicesRequest* request,
                                        fitrun::v1::ListDevicesResponse* response) override;
  grpc::ServerWriteReactor<fitrun::v1::LogChunk>* StreamLogs(grpc::CallbackServerContext* context,
                                                             const fitrun::v1::StreamLogsRequest* request) override;

  WatchFanout::Stats fanout_stats() const { return fanout_.stats(); }

 private:
  // The caller, from the call's bearer token or verified client certificate; UNAUTHENTICATED when a
  // secured fitrund cannot tell.
  absl::StatusOr<Caller> Authenticate(grpc::CallbackServerContext* context) const;
  // Admits a watch or log stream of the job: the caller may see it and has a stream to spare (under
  // max_streams_per_user). Returns the caller's name for ReleaseStream when the stream is done.
  absl::StatusOr<std::string> AdmitStream(grpc::CallbackServerContext* context, const std::string& job_id);
  void ReleaseStream(const std::string& user);
  // The job, if the caller may see it; NOT_FOUND otherwise, so another user's job is not revealed.
  absl::StatusOr<fitrun::v1::Job> VisibleJob(const Caller& caller, const std::string& job_id) const;

  JobManager* const manager_;
  const Authenticator* const authenticator_;
  const int max_streams_per_user_;
  absl::Mutex streams_mu_;
  std::map<std::string, int> streams_by_user_ ABSL_GUARDED_BY(streams_mu_);
  // Wakes following log streams a few times a second to look for appended bytes.
  LogFollowTicker ticker_;
  WatchFanout fanout_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_COORDINATOR_SERVICE_H_
