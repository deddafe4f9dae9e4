// Coordinator benchmarks, printed as figures (not assertions):
//   1. one scheduling pass over 10,000 queued jobs on 1,024 virtual devices;
//   2. event ingest: worker reports through real WorkerChannel streams into the SQLite store and out
//      to 100 real WatchJobEvents streams, as fast as they go (reports sent BATCH to a message, as
//      the worker's reporter sends what it has queued);
//   3. latency from a worker's report to a watcher at a steady 10,000 events/s, the reports queued at
//      that rate and written as a rank's reporter writes them (what queued during the previous
//      write goes as one ReportBatch).
// Workers and watchers are gRPC clients in this process on 127.0.0.1; the launcher is a fake (no
// training processes), so the figures are the coordinator's own costs.
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include <google/protobuf/arena.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "fitrun/v1/worker.grpc.pb.h"
#include "proto/contract/log.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/service/coordinator_service.h"
#include "server/service/worker_channel_service.h"
#include "server/store/sqlite_job_store.h"

namespace fitrun::server {
namespace {

fitrun::v1::JobSpec OneDeviceSpec(int i) {
  fitrun::v1::JobSpec spec;
  spec.set_name(absl::StrCat("bench-", i));
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
  spec.mutable_optimizer()->set_lr(0.05);
  spec.set_global_batch_size(64);
  spec.set_max_steps(10);
  spec.set_priority(i % 5);
  spec.mutable_resources()->set_min_devices(1);
  spec.mutable_resources()->set_max_devices(i % 3 == 0 ? 2 : 1);
  return spec;
}

std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat("/tmp/fitrun-bench-", getpid(), "-", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Returns whether the passes did what they are timed doing: the first placed jobs until the devices
// ran out, the second found none free.
bool BenchmarkSchedulingPass() {
  constexpr int kJobs = 10000;
  constexpr int kDevices = 1024;
  FakeJobStore store;
  FakeDeviceInventory devices(kDevices, 16LL << 30);
  FakeWorkerLauncher launcher;
  NoopCoordinatorMetrics metrics;
  JobManager::Options options;
  options.state_dir = TempDir("scheduling");
  options.worker_binary = "/bin/true";
  options.run_scheduler_thread = false;
  auto manager = JobManager::Create(options, &store, &devices, &launcher, &metrics);
  if (!manager.ok()) {
    contract::LogError("%s", manager.status().message());
    return false;
  }
  for (int i = 0; i < kJobs; ++i) {
    if (absl::StatusOr<fitrun::v1::Job> job = (*manager)->Submit(OneDeviceSpec(i)); !job.ok()) {
      contract::LogError("scheduling: submit %d: %s", i, job.status().message());
      return false;
    }
  }
  const JobManager::SchedulingPassTimes first = (*manager)->RunSchedulingPass();
  const JobManager::SchedulingPassTimes busy = (*manager)->RunSchedulingPass();
  printf("scheduling: %d queued jobs (1 or 2 devices each, 5 priorities) on %d virtual devices\n", first.queued,
         kDevices);
  printf("  pass 1: placed %d jobs in %.1f ms (placing), then launched them in %.1f ms (assignment files, store)\n",
         first.placed, absl::ToDoubleMilliseconds(first.placing), absl::ToDoubleMilliseconds(first.launching));
  printf("  pass 2 (every device busy, %d queued): %.2f ms\n", busy.queued, absl::ToDoubleMilliseconds(busy.placing));
  (*manager)->Shutdown();
  std::filesystem::remove_all(options.state_dir);
  return first.placed > 0 && busy.placed == 0;
}

// A worker rank's report stream, opened with the job's Hello.
class RankStream {
 public:
  RankStream(fitrun::v1::WorkerChannel::Stub& stub, const std::string& job_id, int rank, const std::string& token) {
    stream_ = stub.Connect(&context_);
    fitrun::v1::WorkerReport hello;
    hello.mutable_hello()->set_job_id(job_id);
    hello.mutable_hello()->set_attempt(1);
    hello.mutable_hello()->set_rank(rank);
    hello.mutable_hello()->set_world_size(2);
    hello.mutable_hello()->set_job_token(token);
    stream_->Write(hello);
  }
  bool Write(const fitrun::v1::WorkerReport& report) { return stream_->Write(report); }
  void Close() {
    stream_->WritesDone();
    stream_->Finish();
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<fitrun::v1::WorkerReport, fitrun::v1::WorkerCommand>> stream_;
};

int64_t NowNanos() { return absl::ToUnixNanos(absl::Now()); }

// What the watchers count, shared by all of them.
struct WatchCounters {
  std::atomic<int64_t> delivered{0};
  std::atomic<int64_t> missed{0};    // events watchers were told they missed (EventsMissed ranges)
  std::atomic<int64_t> messages{0};  // WatchJobEvents messages read
  std::atomic<bool> measuring_latency{false};
  // Watchers start one event early (at count_from - 1) so each proves it is connected by receiving
  // it; that event is not counted.
  int64_t count_from = 0;
  std::atomic<int> ready{0};  // watchers that received their first message
  std::atomic<int> ended{0};  // watchers whose stream ended before the benchmark stopped it
  std::atomic<bool> stopping{false};  // set before the job is cancelled, which ends the streams
};

// One paced report's timing, in nanoseconds: from the rank making it to the coordinator stamping it
// (the event's time, set just before it is stored), and from there to the watcher having parsed it.
struct LatencySample {
  int64_t to_coordinator = 0;
  int64_t to_watcher = 0;
  int64_t total() const { return to_coordinator + to_watcher; }
};

// Counts (and, in the latency phase, times) one parsed JobEventBatch; `latencies` is the watcher's own.
void CountBatch(const fitrun::v1::JobEventBatch& batch, WatchCounters& counters, std::vector<LatencySample>& latencies) {
  const int64_t now = NowNanos();
  int64_t delivered = 0;
  for (const fitrun::v1::JobEvent& event : batch.events()) {
    if (event.sequence() != 0 && event.sequence() < counters.count_from) {
      counters.ready.fetch_add(1);
      continue;
    }
    if (event.has_missed()) {
      counters.missed.fetch_add(event.missed().last_sequence() - event.missed().first_sequence() + 1,
                                std::memory_order_relaxed);
      continue;
    }
    ++delivered;
    if (event.has_log() && counters.measuring_latency.load(std::memory_order_relaxed)) {
      int64_t sent = 0;
      if (absl::SimpleAtoi(event.log().text(), &sent)) {
        const int64_t stamped = event.time().seconds() * 1000000000 + event.time().nanos();
        latencies.push_back(LatencySample{stamped - sent, now - stamped});
      }
    }
  }
  counters.delivered.fetch_add(delivered, std::memory_order_relaxed);
  counters.messages.fetch_add(1, std::memory_order_relaxed);
}

// One WatchJobEvents stream on a connection of its own, read by gRPC's callback threads (a few
// client threads rather than 100). Every message is parsed into a JobEventBatch and every event
// counted. Measured against ThreadWatcher on this machine it did not help (gRPC 1.51's callback
// client serializes much of the work), so it is a flag, not the default.
class CallbackWatcher : public grpc::ClientReadReactor<fitrun::v1::JobEventBatch> {
 public:
  CallbackWatcher(const std::string& address, int index, const std::string& job_id, int64_t from_sequence,
                  WatchCounters* counters)
      : counters_(counters) {
    grpc::ChannelArguments args;
    args.SetInt("fitrun.watcher", index);  // a channel (connection) of its own
    stub_ = fitrun::v1::Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    request_.set_job_id(job_id);
    request_.set_from_sequence(from_sequence - 1);
    stub_->async()->WatchJobEvents(&context_, &request_, this);
    StartRead(&batch_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      if (!counters_->stopping.load()) counters_->ended.fetch_add(1);
      return;
    }
    CountBatch(batch_, *counters_, latencies_);
    StartRead(&batch_);
  }
  void OnDone(const grpc::Status&) override { done_.Notify(); }
  void Stop() {
    context_.TryCancel();
    done_.WaitForNotification();
  }
  // Read after Stop.
  const std::vector<LatencySample>& latencies() const { return latencies_; }

 private:
  WatchCounters* const counters_;
  std::unique_ptr<fitrun::v1::Coordinator::Stub> stub_;
  grpc::ClientContext context_;
  fitrun::v1::WatchJobRequest request_;
  fitrun::v1::JobEventBatch batch_;
  std::vector<LatencySample> latencies_;
  absl::Notification done_;
};

// One WatchJobEvents stream on a connection of its own, read by a blocking reader on a thread of
// its own (the default).
class ThreadWatcher {
 public:
  ThreadWatcher(const std::string& address, int index, const std::string& job_id, int64_t from_sequence,
                WatchCounters* counters) {
    thread_ = std::thread([=] {
      pthread_setname_np(pthread_self(), "bench-watcher");
      grpc::ChannelArguments args;
      args.SetInt("fitrun.watcher", index);
      auto stub = fitrun::v1::Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      fitrun::v1::WatchJobRequest request;
      request.set_job_id(job_id);
      request.set_from_sequence(from_sequence - 1);
      auto reader = stub->WatchJobEvents(&context_, request);
      // Each message is parsed into an arena that is reset after it is counted: no malloc or free
      // per event, as a client that reads a million events a second would do.
      std::vector<char> first_block(256 << 10);
      google::protobuf::ArenaOptions arena_options;
      arena_options.initial_block = first_block.data();
      arena_options.initial_block_size = first_block.size();
      google::protobuf::Arena arena(arena_options);
      while (true) {
        auto* batch = google::protobuf::Arena::CreateMessage<fitrun::v1::JobEventBatch>(&arena);
        if (!reader->Read(batch)) break;
        CountBatch(*batch, *counters, latencies_);
        arena.Reset();
      }
      const grpc::Status status = reader->Finish();
      if (!counters->stopping.load()) {
        counters->ended.fetch_add(1);
        contract::LogError("watcher %d ended early: %s", index, status.error_message());
      }
    });
  }
  void Stop() {
    context_.TryCancel();
    thread_.join();
  }
  const std::vector<LatencySample>& latencies() const { return latencies_; }

 private:
  grpc::ClientContext context_;
  std::vector<LatencySample> latencies_;
  std::thread thread_;
};

// Sends a rank's reports the way fitrun-worker's reporter does: callers only queue, and a writer
// thread writes everything queued while its previous write was in flight as one message (a
// ReportBatch of at most `max_batch`; 1 sends each report alone).
class BatchingSender {
 public:
  BatchingSender(RankStream* rank, size_t max_batch) : rank_(rank), max_batch_(std::max<size_t>(1, max_batch)) {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "bench-sender");
      WriteLoop();
    });
  }
  void Send(fitrun::v1::WorkerReport report) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(report));
  }
  // Writes what is queued, then stops.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  int64_t messages() const { return messages_; }  // after Stop

 private:
  void WriteLoop() {
    absl::MutexLock lock(&mu_);
    while (true) {
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      fitrun::v1::WorkerReport message;
      if (max_batch_ == 1 || queue_.size() == 1) {
        message = std::move(queue_.front());
        queue_.pop_front();
      } else {
        while (!queue_.empty() && static_cast<size_t>(message.batch().reports_size()) < max_batch_) {
          *message.mutable_batch()->add_reports() = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      mu_.Unlock();
      rank_->Write(message);
      ++messages_;
      mu_.Lock();
    }
  }

  RankStream* const rank_;
  const size_t max_batch_;
  absl::Mutex mu_;
  std::deque<fitrun::v1::WorkerReport> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t messages_ = 0;  // the writer thread's
  std::thread thread_;
};

struct BenchOptions {
  int watchers = 100;
  int flood_events = 100000;
  int flood_batch = 64;
  int paced_rate = 10000;
  int paced_events = 20000;
  int paced_max_batch = 256;  // the reporter's max_reports_per_message; 1: one message per report
  bool callback_watchers = false;
  bool in_memory_store = false;
  WatchFanout::Options fanout;
};

void PrintFanout(const char* phase, const WatchFanout::Stats& before, const WatchFanout::Stats& after,
                 absl::Duration wall) {
  const int64_t passes = after.passes - before.passes;
  const int64_t pumps = after.pumps - before.pumps;
  const absl::Duration pumping = after.pumping - before.pumping;
  printf("  fan-out (%s): %lld passes, %lld watcher wakes, %.1f us a wake, busy %.0f%% of %.2f s\n", phase,
         static_cast<long long>(passes), static_cast<long long>(pumps),
         pumps ? absl::ToDoubleMicroseconds(pumping) / pumps : 0.0,
         100.0 * absl::ToDoubleSeconds(pumping) / absl::ToDoubleSeconds(wall), absl::ToDoubleSeconds(wall));
}

// Returns whether every event reached every watcher (delivered once, or reported missed): figures
// from a run that lost events are not figures, and the smoke test (//server/bench:coordinator_bench_test)
// fails on them.
bool BenchmarkIngestAndLatency(const BenchOptions& bench) {
  const std::string dir = TempDir("ingest");
  auto store = SqliteJobStore::Open(dir + "/fitrun.db");
  if (!store.ok()) {
    printf("event ingest: %s\n", std::string(store.status().message()).c_str());
    return false;
  }
  FakeDeviceInventory devices(2, 16LL << 30);
  FakeWorkerLauncher launcher;
  NoopCoordinatorMetrics metrics;
  JobManager::Options options;
  options.state_dir = dir;
  options.worker_binary = "/bin/true";
  options.max_events_per_job = 0;  // what ingest costs, however many events one job has
  FakeJobStore in_memory_store;  // --in_memory_store: what the coordinator costs without SQLite
  JobStore* job_store = bench.in_memory_store ? static_cast<JobStore*>(&in_memory_store) : store->get();
  auto manager = JobManager::Create(options, job_store, &devices, &launcher, &metrics);
  if (!manager.ok()) {
    printf("event ingest: %s\n", std::string(manager.status().message()).c_str());
    return false;
  }
  CoordinatorService::Options service_options;
  service_options.fanout = bench.fanout;
  CoordinatorService coordinator_service(manager->get(), service_options);
  WorkerChannelService worker_service(manager->get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&coordinator_service);
  builder.RegisterService(&worker_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const std::string address = absl::StrCat("127.0.0.1:", port);

  fitrun::v1::JobSpec spec = OneDeviceSpec(0);
  spec.mutable_resources()->set_min_devices(2);
  spec.mutable_resources()->set_max_devices(2);
  spec.set_max_steps(1000000000);
  absl::StatusOr<fitrun::v1::Job> job = (*manager)->Submit(spec);
  if (!job.ok() || !launcher.WaitForLaunches(2, absl::Seconds(60))) {
    printf("event ingest: the benchmark job did not start (%s)\n",
           job.ok() ? "no launch within 60 s" : std::string(job.status().message()).c_str());
    return false;
  }
  const std::string token = launcher.launches()[0].job_token;
  const int64_t first_sequence = (*manager)->events().LastSequence(job->id()) + 1;

  // Watchers, each on its own connection, following from the next event.
  WatchCounters counters;
  counters.count_from = first_sequence;
  std::vector<std::unique_ptr<CallbackWatcher>> callback_watchers;
  std::vector<std::unique_ptr<ThreadWatcher>> thread_watchers;
  for (int w = 0; w < bench.watchers; ++w) {
    if (!bench.callback_watchers) {
      thread_watchers.push_back(std::make_unique<ThreadWatcher>(address, w, job->id(), first_sequence, &counters));
    } else {
      callback_watchers.push_back(std::make_unique<CallbackWatcher>(address, w, job->id(), first_sequence, &counters));
    }
  }
  const absl::Time connecting = absl::Now();
  while (counters.ready.load() + counters.ended.load() < bench.watchers && absl::Now() - connecting < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  bool complete = true;
  if (counters.ready.load() < bench.watchers) {
    complete = false;
    printf("event ingest: only %d of %d watchers connected (%d ended)\n", counters.ready.load(), bench.watchers,
           counters.ended.load());
  }
  const int watching = counters.ready.load();

  auto worker_stub = fitrun::v1::WorkerChannel::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  RankStream rank0(*worker_stub, job->id(), 0, token);
  RankStream rank1(*worker_stub, job->id(), 1, token);

  // 1. Flood: both ranks report progress as fast as the stream takes it, flood_batch reports a message.
  const int kBatch = bench.flood_batch;
  const int kFloodEvents = bench.flood_events;
  auto flood = [&](RankStream& rank) {
    fitrun::v1::WorkerReport message;
    for (int i = 0; i < kFloodEvents / 2; ++i) {
      fitrun::v1::WorkerReport* report = kBatch > 1 ? message.mutable_batch()->add_reports() : &message;
      report->mutable_progress()->set_step(i);
      report->mutable_progress()->set_loss(1.0 / (i + 1));
      if (kBatch <= 1 || message.batch().reports_size() == kBatch || i + 1 == kFloodEvents / 2) {
        rank.Write(message);
        message.Clear();
      }
    }
  };
  const WatchFanout::Stats fanout_at_start = coordinator_service.fanout_stats();
  const absl::Time flood_start = absl::Now();
  std::thread second([&] { flood(rank1); });
  flood(rank0);
  second.join();
  const int64_t target = first_sequence + kFloodEvents - 1;
  while ((*manager)->events().LastSequence(job->id()) < target && absl::Now() - flood_start < absl::Seconds(120)) {
    absl::SleepFor(absl::Microseconds(200));
  }
  if ((*manager)->events().LastSequence(job->id()) < target) {
    complete = false;
    printf("  ingest stopped short: %lld of %d events stored after 120 s\n",
           static_cast<long long>((*manager)->events().LastSequence(job->id()) - first_sequence + 1), kFloodEvents);
  }
  const absl::Duration ingest = absl::Now() - flood_start;
  // Every watcher has either received or been told it missed each flooded event.
  const int64_t want_delivered = static_cast<int64_t>(kFloodEvents) * watching;
  while (counters.delivered.load() + counters.missed.load() < want_delivered &&
         absl::Now() - flood_start < absl::Seconds(120)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (counters.delivered.load() + counters.missed.load() < want_delivered) {
    complete = false;
    printf("  watchers stopped short after 120 s: %lld of %lld delivered or reported missed (%d streams ended)\n",
           static_cast<long long>(counters.delivered.load() + counters.missed.load()),
           static_cast<long long>(want_delivered), counters.ended.load());
  }
  const absl::Duration fanout = absl::Now() - flood_start;
  const int64_t delivered = counters.delivered.load();
  const int64_t missed = counters.missed.load();
  printf("event ingest: %d progress reports from 2 rank streams (%d a message) into SQLite (WAL), %d watchers "
         "following (%s)\n",
         kFloodEvents, std::max(1, kBatch), bench.watchers,
         bench.callback_watchers ? "callback readers" : "a thread each");
  printf("  accepted into the store and published: %.0f events/s (%.2f s)\n",
         kFloodEvents / absl::ToDoubleSeconds(ingest), absl::ToDoubleSeconds(ingest));
  printf("  watchers done after %.2f s: %.0f deliveries/s in all (%lld delivered, %lld missed = %.1f%% of %lld; "
         "%.1f events a message)\n",
         absl::ToDoubleSeconds(fanout), delivered / absl::ToDoubleSeconds(fanout), static_cast<long long>(delivered),
         static_cast<long long>(missed), want_delivered ? 100.0 * missed / want_delivered : 0.0,
         static_cast<long long>(want_delivered),
         counters.messages.load() ? static_cast<double>(delivered) / counters.messages.load() : 0.0);
  const WatchFanout::Stats fanout_after_flood = coordinator_service.fanout_stats();
  PrintFanout("flood", fanout_at_start, fanout_after_flood, fanout);
  absl::SleepFor(absl::Milliseconds(200));

  // 2. Latency at a steady rate: log reports stamped with the time the rank makes them (queues them
  //    to its sender), sent as the worker's reporter sends.
  const int64_t missed_after_flood = counters.missed.load();
  const int64_t messages_after_flood = counters.messages.load();
  counters.measuring_latency = true;
  const WatchFanout::Stats fanout_before_paced = coordinator_service.fanout_stats();
  BatchingSender sender0(&rank0, bench.paced_max_batch);
  BatchingSender sender1(&rank1, bench.paced_max_batch);
  const absl::Duration interval = absl::Seconds(1) / bench.paced_rate;
  const absl::Time paced_start = absl::Now();
  fitrun::v1::WorkerReport report;
  for (int i = 0; i < bench.paced_events; ++i) {
    // Sleep (not spin) until the report is due, so the pacer does not take a core from the rest.
    const absl::Time due = paced_start + interval * i;
    const absl::Time now = absl::Now();
    if (now < due) absl::SleepFor(due - now);
    report.mutable_log()->set_text(absl::StrCat(NowNanos()));
    (i % 2 ? sender1 : sender0).Send(report);
  }
  const absl::Duration pacing = absl::Now() - paced_start;
  sender0.Stop();
  sender1.Stop();
  const int64_t paced_target = static_cast<int64_t>(kFloodEvents + bench.paced_events) * watching;
  while (counters.delivered.load() + counters.missed.load() < paced_target &&
         absl::Now() - paced_start < absl::Seconds(120)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Duration paced_wall = absl::Now() - paced_start;
  const WatchFanout::Stats fanout_after_paced = coordinator_service.fanout_stats();

  counters.stopping = true;
  rank0.Close();
  rank1.Close();
  (void)(*manager)->Cancel(job->id(), "benchmark done");
  std::vector<int64_t> all, to_coordinator, to_watcher;
  auto collect = [&](const std::vector<LatencySample>& samples) {
    for (const LatencySample& sample : samples) {
      all.push_back(sample.total());
      to_coordinator.push_back(sample.to_coordinator);
      to_watcher.push_back(sample.to_watcher);
    }
  };
  for (auto& watcher : callback_watchers) {
    watcher->Stop();
    collect(watcher->latencies());
  }
  for (auto& watcher : thread_watchers) {
    watcher->Stop();
    collect(watcher->latencies());
  }
  for (std::vector<int64_t>* samples : {&all, &to_coordinator, &to_watcher}) std::sort(samples->begin(), samples->end());
  auto pct_of = [](const std::vector<int64_t>& sorted, double p) {
    return sorted.empty() ? 0.0 : sorted[static_cast<size_t>(p * (sorted.size() - 1))] / 1e6;
  };
  auto pct = [&](double p) { return pct_of(all, p); };
  const int64_t paced_messages = sender0.messages() + sender1.messages();
  printf("latency, worker report -> watcher, at %d events/s (%.0f made) with %d watchers, reports sent as queued "
         "(up to %d a message: %.1f a message on average): p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu samples of "
         "%lld, %lld missed; %.1f events a watcher message)\n",
         bench.paced_rate, bench.paced_events / absl::ToDoubleSeconds(pacing), bench.watchers, bench.paced_max_batch,
         paced_messages ? static_cast<double>(bench.paced_events) / paced_messages : 0.0, pct(0.5), pct(0.99),
         pct(1.0), all.size(), static_cast<long long>(bench.paced_events) * watching,
         static_cast<long long>(counters.missed.load() - missed_after_flood),
         counters.messages.load() > messages_after_flood
             ? static_cast<double>(all.size()) / (counters.messages.load() - messages_after_flood)
             : 0.0);
  printf("  of which rank -> coordinator (received, stamped): p50 %.2f ms, p99 %.2f ms; coordinator -> watcher (stored, fanned out, parsed): "
         "p50 %.2f ms, p99 %.2f ms\n",
         pct_of(to_coordinator, 0.5), pct_of(to_coordinator, 0.99), pct_of(to_watcher, 0.5), pct_of(to_watcher, 0.99));
  PrintFanout("paced", fanout_before_paced, fanout_after_paced, paced_wall);
  const int64_t paced_accounted = static_cast<int64_t>(all.size()) + counters.missed.load() - missed_after_flood;
  if (paced_accounted != static_cast<int64_t>(bench.paced_events) * watching) {
    complete = false;
    printf("  paced events accounted for: %lld, want %lld (each delivered once or reported missed)\n",
           static_cast<long long>(paced_accounted), static_cast<long long>(bench.paced_events) * watching);
  }
  if (counters.ended.load() > 0) {
    complete = false;
    printf("  %d watcher streams ended before the benchmark stopped them\n", counters.ended.load());
  }

  server->Shutdown();
  (*manager)->Shutdown();
  std::filesystem::remove_all(dir);
  return complete;
}

}  // namespace
}  // namespace fitrun::server

// Usage: coordinator_bench [WATCHERS [FLOOD_EVENTS [PACED_RATE [PACED_EVENTS [BATCH]]]]] [--flags]
// (defaults 100 100000 10000 20000 64). Flags, for comparisons: --paced_max_batch=N (1: one message
// per paced report), --callback_watchers (gRPC callback readers instead of a blocking reader thread
// per watcher), --window_us=N (the
// fan-out's window), --fixed_window (wait the window after every wake), --fanout_threads=N,
// --in_memory_store (the test fake instead of SQLite, to see what the store costs).
int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  // As fitrund runs (server/main.cc): without Abseil's lock-order checks.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  fitrun::server::BenchOptions bench;
  std::vector<int> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    int value = 0;
    auto flag = [&](const char* name) {
      const std::string prefix = absl::StrCat("--", name, "=");
      return arg.rfind(prefix, 0) == 0 && absl::SimpleAtoi(arg.substr(prefix.size()), &value);
    };
    if (arg == "--callback_watchers") {
      bench.callback_watchers = true;
    } else if (arg == "--in_memory_store") {
      bench.in_memory_store = true;
    } else if (arg == "--fixed_window") {
      bench.fanout.always_wait = true;
    } else if (flag("paced_max_batch")) {
      bench.paced_max_batch = value;
    } else if (flag("window_us")) {
      bench.fanout.window = absl::Microseconds(value);
    } else if (flag("fanout_threads")) {
      bench.fanout.threads = value;
    } else if (absl::SimpleAtoi(arg, &value)) {
      positional.push_back(value);
    } else {
      fprintf(stderr, "coordinator_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  auto arg = [&](size_t i, int fallback) { return positional.size() > i ? positional[i] : fallback; };
  bench.watchers = arg(0, 100);
  bench.flood_events = arg(1, 100000);
  bench.paced_rate = arg(2, 10000);
  bench.paced_events = arg(3, 20000);
  bench.flood_batch = arg(4, 64);
  printf("fitrun coordinator benchmark (%u cores)\n", std::thread::hardware_concurrency());
  if (!fitrun::server::BenchmarkSchedulingPass()) {
    fitrun::contract::LogError("the scheduling passes did not place what they should; no figures count");
    return 1;
  }
  if (!fitrun::server::BenchmarkIngestAndLatency(bench)) {
    fitrun::contract::LogError("events were lost or streams ended early; the figures above do not count");
    return 1;
  }
  return 0;
}
