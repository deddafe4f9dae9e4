// submit_bench: how long SubmitJob takes while fitrund measures a workload it has never seen, and once
// it has. Prints figures; asserts nothing.
//
// It starts the real fitrund (fresh state directory, real fitrun-worker for the memory probe, virtual
// CPU devices), then CLIENTS threads, each with its own gRPC channel, submit JOBS jobs of one spec in
// all, as fast as they get answers (each connected before the clock starts): a workload the daemon has never seen, so the first submit starts
// its memory probe and every other one arrives while it runs. Then, once the probe is in, the same
// again for the calibrated workload. For each phase: SubmitJob's latency (p50, p90, p99, max), the
// submits per second, whether the probe was still running when the phase ended, and that every
// acknowledged job is stored exactly once. fitrund is stopped (and its ranks with it) at the end.
//
//   bazel build -c opt //server:fitrund //worker:fitrun-worker //server/bench:submit_bench
//   bazel-bin/server/bench/submit_bench --fitrund=bazel-bin/server/fitrund
//       --worker_binary=bazel-bin/worker/fitrun-worker [--clients=32 --jobs=1000 --model=cnn]
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "proto/contract/log.h"
#include "server/bench/bench_daemon.h"

ABSL_FLAG(std::string, fitrund, "bazel-bin/server/fitrund", "the fitrund binary");
ABSL_FLAG(std::string, worker_binary, "bazel-bin/worker/fitrun-worker", "the fitrun-worker binary");
ABSL_FLAG(int, clients, 32, "concurrent clients, each on its own channel");
ABSL_FLAG(int, jobs, 1000, "jobs submitted per phase");
ABSL_FLAG(std::string, model, "cnn", "mlp or cnn (with Adam)");
ABSL_FLAG(std::string, devices, "cpu:2x1GiB", "fitrund --devices");

namespace fitrun::server {
namespace {

using bench::Daemon;
using bench::ReadFile;

std::string Spec(const std::string& model) {
  return absl::StrCat("name: submit-bench\nmodel: {builtin: ", model,
                      "}\ndata: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
                      "optimizer: {kind: adam, lr: 0.001}\nglobal_batch_size: 256\nmax_steps: 1\n"
                      "resources: {min_devices: 1, max_devices: 2}\n");
}

struct Phase {
  std::vector<double> latencies_ms;
  int failed = 0;
  double seconds = 0;
  std::vector<std::string> ids;
};

Phase Submit(const std::string& address, const std::string& spec) {
  const int clients = absl::GetFlag(FLAGS_clients);
  const int jobs = absl::GetFlag(FLAGS_jobs);
  std::atomic<int> next{0};
  absl::Mutex mu;
  Phase phase;
  std::vector<std::unique_ptr<fitrun::v1::Coordinator::Stub>> stubs;
  for (int c = 0; c < clients; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection of its own, as separate clients have
    auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    // Connected before the clock starts: the figures are SubmitJob's, not TCP's and HTTP/2's set-up.
    channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stubs.push_back(fitrun::v1::Coordinator::NewStub(channel));
  }
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      while (next.fetch_add(1) < jobs) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        fitrun::v1::SubmitJobRequest request;
        request.set_spec_yaml(spec);
        fitrun::v1::SubmitJobResponse response;
        const absl::Time sent = absl::Now();
        const grpc::Status status = stubs[c]->SubmitJob(&context, request, &response);
        const double ms = absl::ToDoubleMilliseconds(absl::Now() - sent);
        absl::MutexLock lock(&mu);
        if (!status.ok()) {
          ++phase.failed;
          contract::LogError("SubmitJob: %s", status.error_message());
          continue;
        }
        phase.latencies_ms.push_back(ms);
        phase.ids.push_back(response.job().id());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  phase.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::sort(phase.latencies_ms.begin(), phase.latencies_ms.end());
  return phase;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(p * static_cast<double>(sorted.size())))];
}

fitrun::v1::Job GetJob(fitrun::v1::Coordinator::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  fitrun::v1::GetJobRequest request;
  request.set_job_id(id);
  fitrun::v1::Job job;
  (void)stub.GetJob(&context, request, &job);
  return job;
}

void Print(const std::string& name, const Phase& phase, const std::string& after) {
  std::printf("| %s | %zu | %d | %.1f | %.1f | %.1f | %.1f | %.0f | %s |\n", name.c_str(), phase.latencies_ms.size(),
              phase.failed, Percentile(phase.latencies_ms, 0.5), Percentile(phase.latencies_ms, 0.9),
              Percentile(phase.latencies_ms, 0.99), phase.latencies_ms.empty() ? 0 : phase.latencies_ms.back(),
              phase.seconds > 0 ? phase.latencies_ms.size() / phase.seconds : 0, after.c_str());
  std::fflush(stdout);
}

int Run() {
  const std::string state_dir = absl::StrCat("/tmp/fitrun-submit-bench-", getpid());
  std::filesystem::remove_all(state_dir);
  std::filesystem::create_directories(state_dir);
  int exit_code = 0;
  {
    Daemon daemon(absl::GetFlag(FLAGS_fitrund), state_dir,
                  {"--listen=127.0.0.1:0", "--devices=" + absl::GetFlag(FLAGS_devices),
                   "--worker_binary=" + absl::GetFlag(FLAGS_worker_binary), "--stop_workers_on_exit"});
    const std::string address = daemon.WaitForAddress();
    if (address.empty()) {
      std::fprintf(stderr, "fitrund did not start: %s\n", ReadFile(state_dir + "/fitrund.log").c_str());
      return 1;
    }
    auto stub = fitrun::v1::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    const std::string spec = Spec(absl::GetFlag(FLAGS_model));
    std::printf("SubmitJob from %d clients, %d jobs per phase, %s with Adam, fitrund --devices=%s\n\n",
                absl::GetFlag(FLAGS_clients), absl::GetFlag(FLAGS_jobs), absl::GetFlag(FLAGS_model).c_str(),
                absl::GetFlag(FLAGS_devices).c_str());
    std::printf("| phase | acknowledged | failed | p50 ms | p90 ms | p99 ms | max ms | submits/s | after the phase |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");

    const Phase unseen = Submit(address, spec);
    const fitrun::v1::Job first = unseen.ids.empty() ? fitrun::v1::Job() : GetJob(*stub, *std::min_element(unseen.ids.begin(), unseen.ids.end()));
    const bool still_measuring = first.state() == fitrun::v1::JOB_STATE_PLANNING && first.attempts() == 0;
    Print("a workload never seen (its probe starts with the first submit)", unseen,
          still_measuring ? "the probe was still running" : "the probe had finished");

    // Wait for the calibration: the first job leaves PLANNING once its workload is measured.
    const absl::Time deadline = absl::Now() + absl::Minutes(10);
    while (absl::Now() < deadline) {
      const fitrun::v1::Job job = GetJob(*stub, first.id());
      if (job.state() != fitrun::v1::JOB_STATE_PLANNING && job.state() != fitrun::v1::JOB_STATE_QUEUED) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    const Phase calibrated = Submit(address, spec);
    Print("the same workload, measured", calibrated, "");

    std::vector<fitrun::v1::Job> stored;
    if (!bench::ListAllJobs(*stub, &stored)) contract::LogError("ListJobs failed");
    const size_t acknowledged = unseen.ids.size() + calibrated.ids.size();
    std::printf("\nacknowledged %zu, stored %zu (each acknowledged job once: %s)\n", acknowledged, stored.size(),
                stored.size() == acknowledged ? "yes" : "NO");
    if (stored.size() != acknowledged) exit_code = 1;
  }
  std::filesystem::remove_all(state_dir);
  return exit_code;
}

}  // namespace
}  // namespace fitrun::server

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fitrun::server::Run();
}
