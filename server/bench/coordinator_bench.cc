// Coordinator benchmarks, printed as figures (not assertions):
//   1. one scheduling pass over 10,000 queued jobs on 1,024 virtual devices;
//   2. event ingest: worker reports through real WorkerChannel streams into the SQLite store and out
//      to 100 real WatchJobEvents streams, as fast as they go (reports sent BATCH to a message, as
//      the worker's reporter sends what it has queued);
//   3. latency from a worker's report to a watcher at a steady 10,000 events/s.
// Workers and watchers are gRPC clients in this process on 127.0.0.1; the launcher is a fake (no
// training processes), so the figures are the coordinator's own costs.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "fitrun/v1/worker.grpc.pb.h"
#include "server/core/fakes.h"
#include "server/core/job_manager.h"
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

void BenchmarkSchedulingPass() {
  constexpr int kJobs = 10000;
  constexpr int kDevices = 1024;
  FakeJobStore store;
  FakeDeviceInventory devices(kDevices, 16LL << 30);
  FakeWorkerLauncher launcher;
  NoopCoordinatorMetrics metrics;
  JobManager::Options options;
  options.state_dir = TempDir("scheduling");
  options.worker_binary = "/bin/true";
  options.pick_master_port = [] { return 29500; };
  options.run_scheduler_thread = false;
  auto manager = JobManager::Create(options, &store, &devices, &launcher, &metrics);
  if (!manager.ok()) {
    fprintf(stderr, "%s\n", std::string(manager.status().message()).c_str());
    return;
  }
  for (int i = 0; i < kJobs; ++i) {
    if (!(*manager)->Submit(OneDeviceSpec(i)).ok()) return;
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

void BenchmarkIngestAndLatency(int kWatchers, int kFloodEvents, int kPacedRate, int kPacedEvents, int kBatch) {
  const std::string dir = TempDir("ingest");
  auto store = SqliteJobStore::Open(dir + "/fitrun.db");
  if (!store.ok()) return;
  FakeDeviceInventory devices(2, 16LL << 30);
  FakeWorkerLauncher launcher;
  NoopCoordinatorMetrics metrics;
  JobManager::Options options;
  options.state_dir = dir;
  options.worker_binary = "/bin/true";
  options.pick_master_port = [] { return 29500; };
  auto manager = JobManager::Create(options, store->get(), &devices, &launcher, &metrics);
  if (!manager.ok()) return;
  CoordinatorService coordinator_service(manager->get());
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
  if (!job.ok() || !launcher.WaitForLaunches(2, absl::Seconds(10))) return;
  std::string token;
  const std::vector<WorkerLaunch> launches = launcher.launches();
  for (const auto& [key, value] : launches[0].env) {
    if (key == "FITRUN_JOB_TOKEN") token = value;
  }
  const int64_t first_sequence = (*manager)->events().LastSequence(job->id()) + 1;

  // Watchers: each on its own channel, following from the next event, timing log events.
  std::atomic<int64_t> delivered{0};
  std::atomic<int64_t> missed{0};    // events watchers were told they missed
  std::atomic<int64_t> messages{0};  // WatchJobEvents messages read
  std::vector<std::vector<int64_t>> latencies(kWatchers);
  std::atomic<bool> measuring_latency{false};
  std::vector<std::thread> watchers;
  std::vector<std::unique_ptr<grpc::ClientContext>> watch_contexts(kWatchers);
  std::atomic<int> watching{0};
  for (int w = 0; w < kWatchers; ++w) {
    watch_contexts[w] = std::make_unique<grpc::ClientContext>();
    watchers.emplace_back([&, w] {
      grpc::ChannelArguments args;
      args.SetInt("fitrun.watcher", w);  // a channel (connection) of its own
      auto stub = fitrun::v1::Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      fitrun::v1::WatchJobRequest request;
      request.set_job_id(job->id());
      request.set_from_sequence(first_sequence);
      auto reader = stub->WatchJobEvents(watch_contexts[w].get(), request);
      watching.fetch_add(1);
      fitrun::v1::JobEventBatch batch;
      while (reader->Read(&batch)) {
        const int64_t now = NowNanos();
        for (const fitrun::v1::JobEvent& event : batch.events()) {
          if (event.has_missed()) {
            missed.fetch_add(event.missed().last_sequence() - event.missed().first_sequence() + 1,
                             std::memory_order_relaxed);
            continue;
          }
          delivered.fetch_add(1, std::memory_order_relaxed);
          if (event.has_log() && measuring_latency.load(std::memory_order_relaxed)) {
            int64_t sent = 0;
            if (absl::SimpleAtoi(event.log().text(), &sent)) latencies[w].push_back(now - sent);
          }
        }
        messages.fetch_add(1, std::memory_order_relaxed);
      }
      reader->Finish();
    });
  }
  while (watching.load() < kWatchers) absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(200));  // let every WatchJob call reach the server

  auto worker_stub = fitrun::v1::WorkerChannel::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  RankStream rank0(*worker_stub, job->id(), 0, token);
  RankStream rank1(*worker_stub, job->id(), 1, token);

  // 1. Flood: both ranks report progress as fast as the stream takes it, kBatch reports a message.
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
  const absl::Time flood_start = absl::Now();
  std::thread second([&] { flood(rank1); });
  flood(rank0);
  second.join();
  const int64_t target = first_sequence + kFloodEvents - 1;
  while ((*manager)->events().LastSequence(job->id()) < target && absl::Now() - flood_start < absl::Seconds(120)) {
    absl::SleepFor(absl::Microseconds(200));
  }
  if ((*manager)->events().LastSequence(job->id()) < target) {
    printf("  ingest stopped short: %lld of %d events stored after 120 s\n",
           static_cast<long long>((*manager)->events().LastSequence(job->id()) - first_sequence + 1), kFloodEvents);
  }
  const absl::Duration ingest = absl::Now() - flood_start;
  // Every watcher has either received or been told it missed each flooded event.
  const int64_t want_delivered = static_cast<int64_t>(kFloodEvents) * kWatchers;
  while (delivered.load() + missed.load() < want_delivered && absl::Now() - flood_start < absl::Seconds(300)) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const absl::Duration fanout = absl::Now() - flood_start;
  printf("event ingest: %d progress reports from 2 rank streams (%d a message) into SQLite (WAL), %d watchers following\n",
         kFloodEvents, std::max(1, kBatch), kWatchers);
  printf("  stored and published: %.0f events/s (%.2f s)\n", kFloodEvents / absl::ToDoubleSeconds(ingest),
         absl::ToDoubleSeconds(ingest));
  printf("  watchers done after %.2f s: %.0f deliveries/s in all (%lld delivered, %lld missed of %lld; %.1f events a message)\n",
         absl::ToDoubleSeconds(fanout), delivered.load() / absl::ToDoubleSeconds(fanout),
         static_cast<long long>(delivered.load()), static_cast<long long>(missed.load()),
         static_cast<long long>(want_delivered),
         messages.load() ? static_cast<double>(delivered.load()) / messages.load() : 0.0);
  const int64_t missed_after_flood = missed.load();

  // 2. Latency at a steady rate: log events stamped with their send time.
  measuring_latency = true;
  const absl::Duration interval = absl::Seconds(1) / kPacedRate;
  const absl::Time paced_start = absl::Now();
  fitrun::v1::WorkerReport report;
  for (int i = 0; i < kPacedEvents; ++i) {
    const absl::Time due = paced_start + interval * i;
    while (absl::Now() < due) {
    }
    report.mutable_log()->set_text(absl::StrCat(NowNanos()));
    (i % 2 ? rank1 : rank0).Write(report);
  }
  const int64_t paced_target = static_cast<int64_t>(kFloodEvents + kPacedEvents) * kWatchers;
  while (delivered.load() + missed.load() < paced_target && absl::Now() - paced_start < absl::Seconds(120)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const double achieved = kPacedEvents / absl::ToDoubleSeconds(absl::Now() - paced_start);
  std::vector<int64_t> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all.empty() ? 0.0 : all[static_cast<size_t>(p * (all.size() - 1))] / 1e6; };
  printf("latency, worker report -> watcher, at %d events/s (%.0f achieved) with %d watchers: p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu samples, %lld missed)\n",
         kPacedRate, achieved, kWatchers, pct(0.5), pct(0.99), pct(1.0), all.size(),
         static_cast<long long>(missed.load() - missed_after_flood));


  rank0.Close();
  rank1.Close();
  (void)(*manager)->Cancel(job->id(), "benchmark done");
  for (auto& context : watch_contexts) context->TryCancel();
  for (auto& t : watchers) t.join();
  server->Shutdown();
  (*manager)->Shutdown();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fitrun::server

// Usage: coordinator_bench [WATCHERS [FLOOD_EVENTS [PACED_RATE [PACED_EVENTS [BATCH]]]]]
// (defaults 100 20000 10000 20000 64).
int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  printf("fitrun coordinator benchmark (%u cores)\n", std::thread::hardware_concurrency());
  fitrun::server::BenchmarkSchedulingPass();
  fitrun::server::BenchmarkIngestAndLatency(arg(1, 100), arg(2, 20000), arg(3, 10000), arg(4, 20000), arg(5, 64));
  return 0;
}
