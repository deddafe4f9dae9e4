#include "worker/report/grpc_reporter.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/contract/log.h"

namespace fitrun::worker {
namespace {

// Codes that mean the coordinator (or the network) may come back; anything else was deliberate.
bool IsRetryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return true;
    default:
      return false;
  }
}

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
// Connection attempts wait in slices this long so that Shutdown's deadline is honoured.
constexpr absl::Duration kConnectSlice = absl::Milliseconds(100);

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcReporter>> GrpcReporter::Create(Options options,
                                                                   StopCallback on_stop) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("FITRUN_COORDINATOR: empty coordinator address");
  }
  if (options.queue_capacity < 1) {
    return absl::InvalidArgumentError("reporter queue capacity must be >= 1");
  }
  if (options.max_reports_per_message < 1) {
    return absl::InvalidArgumentError("reporter max_reports_per_message must be >= 1");
  }
  grpc::ChannelArguments args;
  // A restarted coordinator should see the rank again within a second or two, not gRPC's default 2 min.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.max_backoff)));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.tls_ca_pem.empty() ? grpc::InsecureChannelCredentials()
                                 : grpc::SslCredentials(grpc::SslCredentialsOptions{options.tls_ca_pem, "", ""});
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(options.coordinator, credentials, args);
  auto reporter = std::unique_ptr<GrpcReporter>(
      new GrpcReporter(std::move(options), std::move(on_stop), std::move(channel)));
  reporter->writer_ = std::thread([r = reporter.get()] { r->WriterLoop(); });
  return reporter;
}

GrpcReporter::GrpcReporter(Options options, StopCallback on_stop,
                           std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      on_stop_(std::move(on_stop)),
      channel_(std::move(channel)),
      stub_(fitrun::v1::WorkerChannel::NewStub(channel_)) {}

GrpcReporter::~GrpcReporter() { Shutdown(absl::ZeroDuration()); }

void GrpcReporter::Log(contract::LogSeverity severity, const std::string& text) {
  contract::Log(severity, absl::StrCat("[rank ", options_.rank, "] reporter: ", text));
}

void GrpcReporter::Enqueue(fitrun::v1::WorkerReport report, bool must_deliver) {
  absl::MutexLock lock(&mu_);
  if (no_reconnect_ && !connected_) {
    ++dropped_;
    return;
  }
  if (queue_.size() >= options_.queue_capacity) {
    // Newer progress supersedes older, so the oldest droppable report makes room.
    auto victim = std::find_if(queue_.begin(), queue_.end(), [](const Queued& q) { return !q.must_deliver; });
    if (victim != queue_.end()) {
      queue_.erase(victim);
      ++dropped_;
    } else if (!must_deliver) {
      ++dropped_;
      return;
    }
  }
  queue_.push_back({std::move(report), must_deliver});
}

void GrpcReporter::OnProgress(const StepProgress& p) {
  fitrun::v1::WorkerReport report;
  fitrun::v1::Progress* progress = report.mutable_progress();
  progress->set_rank(p.rank);
  progress->set_step(p.step);
  progress->set_total_steps(p.total_steps);
  progress->set_epoch(p.epoch);
  progress->set_loss(p.loss);
  progress->set_samples_per_second(p.samples_per_second);
  progress->set_step_seconds(p.step_seconds);
  progress->set_exposed_communication_share(p.exposed_communication_share);
  progress->set_live_bytes(p.live_bytes);
  progress->set_peak_bytes(p.peak_bytes);
  progress->set_reserved_peak_bytes(p.reserved_peak_bytes);
  progress->set_device_peak_bytes(p.device_peak_bytes);
  progress->mutable_metrics()->insert(p.metrics.begin(), p.metrics.end());
  {
    absl::MutexLock lock(&mu_);
    last_step_ = p.step;
  }
  Enqueue(std::move(report), /*must_deliver=*/false);
}

void GrpcReporter::OnLog(const std::string& text) {
  fitrun::v1::WorkerReport report;
  report.mutable_log()->set_rank(options_.rank);
  report.mutable_log()->set_text(text);
  Enqueue(std::move(report), /*must_deliver=*/false);
}

void GrpcReporter::OnCheckpoint(const CheckpointNotice& c) {
  fitrun::v1::WorkerReport report;
  if (!c.error.empty()) {
    fitrun::v1::CheckpointFailed* failed = report.mutable_checkpoint_failed();
    failed->set_rank(c.rank);
    failed->set_step(c.step);
    failed->set_error(c.error);
    Enqueue(std::move(report), /*must_deliver=*/false);
    return;
  }
  fitrun::v1::CheckpointSaved* saved = report.mutable_checkpoint_saved();
  saved->set_rank(c.rank);
  saved->set_step(c.step);
  saved->set_path(c.path);
  saved->set_bytes(c.bytes);
  saved->set_seconds(c.seconds);
  // The coordinator resumes from what it was told about: never drop one for a progress line.
  Enqueue(std::move(report), /*must_deliver=*/true);
}

void GrpcReporter::ReportFinished(const fitrun::v1::RankFinished& finished) {
  fitrun::v1::WorkerReport report;
  *report.mutable_finished() = finished;
  report.mutable_finished()->set_rank(options_.rank);
  Enqueue(std::move(report), /*must_deliver=*/true);
}

void GrpcReporter::ReportFailed(const std::string& reason) {
  fitrun::v1::WorkerReport report;
  report.mutable_failed()->set_reason(reason);
  Enqueue(std::move(report), /*must_deliver=*/true);
}

void GrpcReporter::ReportOutOfMemory(const fitrun::v1::OutOfMemory& oom) {
  fitrun::v1::WorkerReport report;
  *report.mutable_oom() = oom;
  report.mutable_oom()->set_rank(options_.rank);
  Enqueue(std::move(report), /*must_deliver=*/true);
}

void GrpcReporter::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (queue_.empty() && !writing_) || !connected_ || writer_done_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
}

int64_t GrpcReporter::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void GrpcReporter::Shutdown(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) {
      shutting_down_ = true;
      deadline_ = absl::Now() + timeout;
    }
    mu_.AwaitWithDeadline(absl::Condition(&writer_done_), deadline_);
    // Past the deadline: unblock a Write/Read stuck on a silent coordinator.
    if (!writer_done_ && context_ != nullptr) context_->TryCancel();
  }
  if (writer_.joinable()) writer_.join();
}

bool GrpcReporter::OpenStream() {
  // Wait for the channel in short slices: a shutdown deadline must not wait for a full connect timeout.
  const absl::Time connect_deadline = absl::Now() + options_.connect_timeout;
  bool ready = false;
  while (!ready) {
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_ && absl::Now() >= deadline_) return false;
    }
    const absl::Time now = absl::Now();
    if (now >= connect_deadline) break;
    const absl::Time slice_end = std::min(now + kConnectSlice, connect_deadline);
    ready = channel_->WaitForConnected(absl::ToChronoTime(slice_end));
  }
  if (!ready) return false;

  context_owner_ = std::make_unique<grpc::ClientContext>();
  stream_ = stub_->Connect(context_owner_.get());
  fitrun::v1::WorkerReport hello_report;
  fitrun::v1::Hello* hello = hello_report.mutable_hello();
  hello->set_job_id(options_.job_id);
  hello->set_attempt(options_.attempt);
  hello->set_rank(options_.rank);
  hello->set_world_size(options_.world_size);
  hello->set_job_token(options_.job_token);
  hello->set_pid(options_.pid);
  {
    absl::MutexLock lock(&mu_);
    context_ = context_owner_.get();
    stream_ended_ = false;
  }
  if (!stream_->Write(hello_report)) {
    CloseStream(/*graceful=*/false);
    return false;
  }
  {
    // Before the reader starts: a StopCommand it reads must find the stream counted as connected,
    // or the RankFailed that answers it would be dropped.
    absl::MutexLock lock(&mu_);
    connected_ = true;
  }
  reader_ = std::thread([this, stream = stream_.get()] { ReaderLoop(stream); });
  Log(contract::LogSeverity::kInfo,
      absl::StrCat(ever_connected_ ? "reconnected to " : "connected to ", options_.coordinator));
  ever_connected_ = true;
  logged_unreachable_ = false;
  return true;
}

void GrpcReporter::ReaderLoop(Stream* stream) {
  fitrun::v1::WorkerCommand command;
  while (stream->Read(&command)) {
    if (command.has_stop()) {
      bool first = false;
      {
        absl::MutexLock lock(&mu_);
        first = !stop_received_;
        stop_received_ = true;
        // The coordinator is ending this attempt: a new stream would only confuse it.
        no_reconnect_ = true;
      }
      if (first && on_stop_) on_stop_(command.stop().reason());
    }
  }
  absl::MutexLock lock(&mu_);
  stream_ended_ = true;
}

void GrpcReporter::CloseStream(bool graceful) {
  bool ended = false;
  if (graceful) {
    stream_->WritesDone();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&stream_ended_), deadline_);
    ended = stream_ended_;
  } else {
    absl::MutexLock lock(&mu_);
    ended = stream_ended_;
  }
  if (!ended) context_owner_->TryCancel();
  if (reader_.joinable()) reader_.join();
  const grpc::Status status = stream_->Finish();
  {
    absl::MutexLock lock(&mu_);
    connected_ = false;
    context_ = nullptr;
    if (!IsRetryable(status.error_code())) no_reconnect_ = true;
    if (no_reconnect_) {
      dropped_ += static_cast<int64_t>(queue_.size());
      queue_.clear();
    }
  }
  if (!status.ok() || !graceful) {
    Log(contract::LogSeverity::kWarning,
        absl::StrCat("stream to ", options_.coordinator, " ended: ", status.error_code(), " ", status.error_message()));
  }
  stream_.reset();
  context_owner_.reset();
}

void GrpcReporter::WriterLoop() {
  absl::Duration backoff = kMinBackoff;
  while (true) {
    if (stream_ == nullptr) {
      {
        absl::MutexLock lock(&mu_);
        const bool past_deadline = shutting_down_ && absl::Now() >= deadline_;
        if (past_deadline || (shutting_down_ && queue_.empty()) || (no_reconnect_ && shutting_down_)) {
          break;
        }
        if (no_reconnect_) {
          // Nothing more will be sent; just wait for Shutdown.
          queue_.clear();
          mu_.Await(absl::Condition(&shutting_down_));
          continue;
        }
      }
      if (!OpenStream()) {
        if (!logged_unreachable_) {
          Log(contract::LogSeverity::kWarning, absl::StrCat("cannot reach the coordinator at ", options_.coordinator,
                                                            "; training goes on and reports are retried"));
          logged_unreachable_ = true;
        }
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithDeadline(absl::Condition(&shutting_down_),
                              std::min(absl::Now() + backoff, deadline_));
        backoff = std::min(backoff * 2, options_.max_backoff);
        continue;
      }
      backoff = kMinBackoff;
    }

    // Everything queued goes in one message (a ReportBatch when there are several): the
    // coordinator then stores them in one transaction.
    std::vector<Queued> next;
    bool end_stream = false;
    bool stream_lost = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || shutting_down_ || stream_ended_;
      };
      const bool woken = options_.heartbeat_interval > absl::ZeroDuration()
                             ? mu_.AwaitWithTimeout(absl::Condition(&ready), options_.heartbeat_interval)
                             : (mu_.Await(absl::Condition(&ready)), true);
      if (!woken) {
        // Quiet phases (rendezvous, evaluation, a long step) still show the coordinator a live rank.
        next.emplace_back().report.mutable_heartbeat()->set_step(last_step_);
        writing_ = true;
      } else if (stream_ended_) {
        stream_lost = true;
      } else if (queue_.empty() || absl::Now() >= deadline_) {
        end_stream = true;  // shutting down and drained (or out of time)
      } else {
        while (!queue_.empty() && next.size() < options_.max_reports_per_message) {
          next.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        writing_ = true;
      }
    }
    if (stream_lost) {
      CloseStream(/*graceful=*/false);
      continue;
    }
    if (end_stream) {
      CloseStream(/*graceful=*/true);
      break;
    }
    bool written = false;
    if (next.size() == 1) {
      written = stream_->Write(next.front().report);
    } else {
      fitrun::v1::WorkerReport batch;
      for (Queued& queued : next) *batch.mutable_batch()->add_reports() = std::move(queued.report);
      written = stream_->Write(batch);
      if (!written) {
        for (size_t i = 0; i < next.size(); ++i) next[i].report = std::move(*batch.mutable_batch()->mutable_reports(static_cast<int>(i)));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      // Put lost reports back, in order, so a new stream delivers them; progress that is stale by
      // then is cheap and the coordinator keeps only the latest.
      if (!written) {
        for (auto it = next.rbegin(); it != next.rend(); ++it) queue_.push_front(std::move(*it));
      }
    }
    if (!written) CloseStream(/*graceful=*/false);
  }
  absl::MutexLock lock(&mu_);
  connected_ = false;
  writer_done_ = true;
}

}  // namespace fitrun::worker
