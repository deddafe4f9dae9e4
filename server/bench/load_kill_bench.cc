// load_kill_bench: no job lost or doubled and no event missed when fitrund is SIGKILLed under load.
// Prints figures; exits non-zero when an invariant fails.
//
// It starts the real fitrund on a fresh state directory, with virtual CPU devices and the instant
// worker as its rank binary (worker/testing/instant_worker.cc: the real rank runtime and
// WorkerChannel, no LibTorch, so a job takes milliseconds instead of LibTorch's second of start-up
// per rank; the launcher, store, planner and event streams are fitrund's own). Then:
//   - CLIENTS threads, each on its own channel, submit JOBS jobs in all, each with a request id of
//     its own; a submit that fails (the daemon is gone) is retried with the same request id until
//     it is acknowledged;
//   - WATCHERS threads follow the acknowledged jobs (each job by two watchers) with WatchJob, and on
//     a broken stream reconnect from the sequence after the last one they saw;
//   - after a random number of acknowledged jobs, fitrund is SIGKILLed and started again on the same
//     state directory and port.
// Afterwards: every acknowledged job exists exactly once (no request id has two jobs, no
// acknowledged id is missing), every job ended, and every watcher saw each of its jobs' events once,
// in order, with no gap, each identical to the job's stored history read back at the end.
//
//   bazel build -c opt //server:fitrund //worker/testing:fitrun-instant-worker //server/bench:load_kill_bench
//   bazel-bin/server/bench/load_kill_bench [--clients=32 --jobs=1000 --watchers=100 --seed=N] [--users=N]
//
// With --users=N (as root) fitrund has N users, each with a throwaway Unix account its jobs run as
// (client c submits as user c mod N; the watchers follow as an admin), and the accounts are removed
// at the end.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
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
#include "server/auth/authenticator.h"
#include "server/bench/bench_daemon.h"
#include "proto/contract/free_port.h"

ABSL_FLAG(std::string, fitrund, "bazel-bin/server/fitrund", "the fitrund binary");
ABSL_FLAG(std::string, instant_worker, "bazel-bin/worker/testing/fitrun-instant-worker",
          "the rank binary fitrund launches");
ABSL_FLAG(int, clients, 32, "concurrent submitting clients, each on its own channel");
ABSL_FLAG(int, jobs, 1000, "jobs submitted in all");
ABSL_FLAG(int, watchers, 100, "concurrent watchers");
ABSL_FLAG(std::string, devices, "cpu:4x1GiB", "fitrund --devices");
ABSL_FLAG(uint64_t, seed, 0, "picks the kill moment; 0: a random seed (printed)");
ABSL_FLAG(int, users, 0, "users with Unix accounts of their own (as root; 0: fitrund without users)");

namespace fitrun::server {
namespace {

using fitrun::v1::Coordinator;
using fitrun::v1::Job;
using fitrun::v1::JobEvent;

constexpr absl::Duration kGiveUpAfter = absl::Minutes(5);

// With --users: each user's token, and an admin's (the watchers' and the final read's).
std::vector<std::string> user_tokens;
std::string admin_token;

void Authorize(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
}

// --users=N: the throwaway accounts, the tokens file naming them, and the instant worker copied where
// the accounts can run it. Removed by the destructor.
class BenchUsers {
 public:
  bool Make(int count, const std::string& dir, std::string* tokens_file, std::string* worker) {
    std::filesystem::create_directories(dir + "/bin");
    std::filesystem::permissions(dir, std::filesystem::perms(0755));
    std::filesystem::permissions(dir + "/bin", std::filesystem::perms(0755));
    const std::string copy = dir + "/bin/fitrun-instant-worker";
    std::filesystem::copy_file(*worker, copy, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::permissions(copy, std::filesystem::perms(0755));
    *worker = copy;
    std::string lines = absl::StrCat("admin admin ", Authenticator::Sha256Hex("admin-token"), "\n");
    admin_token = "admin-token";
    for (int u = 0; u < count; ++u) {
      const std::string account = absl::StrCat("frl", getpid() % 100000, "-", u);
      if (std::system(("/usr/sbin/useradd --no-create-home --shell /usr/sbin/nologin --user-group " + account).c_str()) != 0) {
        contract::LogError("useradd %s failed (root is needed for --users)", account);
        return false;
      }
      accounts_.push_back(account);
      const std::string token = absl::StrCat("user-token-", u);
      user_tokens.push_back(token);
      absl::StrAppend(&lines, "u", u, " user ", Authenticator::Sha256Hex(token), " ", account, "\n");
    }
    *tokens_file = dir + "/tokens";
    std::ofstream(*tokens_file) << lines;
    return true;
  }
  ~BenchUsers() {
    for (const std::string& account : accounts_) std::system(("/usr/sbin/userdel " + account).c_str());
  }

 private:
  std::vector<std::string> accounts_;
};

bool IsTerminal(fitrun::v1::JobState state) {
  return state == fitrun::v1::JOB_STATE_SUCCEEDED || state == fitrun::v1::JOB_STATE_FAILED ||
         state == fitrun::v1::JOB_STATE_CANCELLED;
}

// A channel of its own (as separate clients have) that comes back quickly after the daemon does.
std::unique_ptr<Coordinator::Stub> NewStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  return Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

std::string Spec() {
  return "name: load-kill\nmodel: {builtin: mlp}\n"
         "data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
         "optimizer: {kind: sgd, lr: 0.1}\nglobal_batch_size: 64\nmax_steps: 1\n"
         "resources: {min_devices: 1, max_devices: 2}\n";
}

// What the submitting clients share.
struct Submissions {
  absl::Mutex mu;
  std::map<std::string, std::string> job_of_request;  // request id -> acknowledged job id
  std::vector<std::string> acknowledged;               // job ids, in the order acknowledged
  int retries = 0;
  int duplicate_acknowledgements = 0;  // a request id acknowledged with two different jobs
  int given_up = 0;
  bool clients_done = false;
};

// What one watcher saw of one job.
struct Followed {
  std::string job_id;
  std::vector<std::string> events;  // serialized, in the order received
  int64_t last_sequence = 0;
  int gaps = 0;
  int duplicates = 0;
  int missed_notices = 0;
  int reconnects = 0;
  std::map<grpc::StatusCode, int> broken_by;  // how streams ended before the job did
  bool ended = false;
};

void Follow(const std::string& address, Followed* followed) {
  auto stub = NewStub(address);
  const absl::Time give_up = absl::Now() + kGiveUpAfter;
  bool first = true;
  while (!followed->ended && absl::Now() < give_up) {
    if (!first) {
      ++followed->reconnects;
      absl::SleepFor(absl::Milliseconds(50));
    }
    first = false;
    grpc::ClientContext context;
    Authorize(&context, admin_token);
    fitrun::v1::WatchJobRequest request;
    request.set_job_id(followed->job_id);
    request.set_from_sequence(followed->last_sequence + 1);
    std::unique_ptr<grpc::ClientReader<JobEvent>> reader = stub->WatchJob(&context, request);
    JobEvent event;
    while (reader->Read(&event)) {
      if (event.sequence() <= followed->last_sequence) {
        ++followed->duplicates;
        continue;
      }
      if (event.sequence() != followed->last_sequence + 1) ++followed->gaps;
      if (event.has_missed()) ++followed->missed_notices;
      followed->last_sequence = event.sequence();
      followed->events.push_back(event.SerializeAsString());
      if (event.has_state_changed() && IsTerminal(event.state_changed().to())) followed->ended = true;
    }
    const grpc::Status status = reader->Finish();
    if (!followed->ended) ++followed->broken_by[status.error_code()];
  }
}

// The job's whole stored history, read once it has ended.
std::vector<std::string> History(Coordinator::Stub& stub, const std::string& job_id) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  Authorize(&context, admin_token);
  fitrun::v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_from_sequence(1);
  auto reader = stub.WatchJob(&context, request);
  std::vector<std::string> events;
  JobEvent event;
  while (reader->Read(&event)) events.push_back(event.SerializeAsString());
  (void)reader->Finish();
  return events;
}

int Run() {
  const int clients = absl::GetFlag(FLAGS_clients);
  const int jobs = absl::GetFlag(FLAGS_jobs);
  const int watchers = absl::GetFlag(FLAGS_watchers);
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = std::random_device()();
  std::mt19937_64 random(seed);
  const int kill_at = jobs / 10 + static_cast<int>(random() % static_cast<uint64_t>(std::max(1, jobs * 8 / 10)));

  const std::string state_dir = absl::StrCat("/tmp/fitrun-load-kill-bench-", getpid());
  std::filesystem::remove_all(state_dir);
  std::filesystem::create_directories(state_dir);
  // A fixed port: the restarted fitrund must come back where the clients dial.
  const std::string address = absl::StrCat("127.0.0.1:", fitrun::contract::PickFreeLoopbackPort().value());
  std::string worker = std::filesystem::absolute(absl::GetFlag(FLAGS_instant_worker)).string();
  BenchUsers users;
  std::string tokens_file;
  if (absl::GetFlag(FLAGS_users) > 0 &&
      !users.Make(absl::GetFlag(FLAGS_users), state_dir + "-install", &tokens_file, &worker)) {
    return 1;
  }
  std::vector<std::string> flags = {"--listen=" + address, "--devices=" + absl::GetFlag(FLAGS_devices),
                                    "--worker_binary=" + worker, "--memory_probe=false", "--stop_workers_on_exit"};
  if (!tokens_file.empty()) flags.push_back("--auth_tokens=" + tokens_file);
  const auto start_daemon = [&] {
    return std::make_unique<bench::Daemon>(std::filesystem::absolute(absl::GetFlag(FLAGS_fitrund)).string(), state_dir,
                                           flags);
  };
  std::unique_ptr<bench::Daemon> daemon = start_daemon();
  if (daemon->WaitForAddress().empty()) {
    std::fprintf(stderr, "fitrund did not start:\n%s\n", bench::ReadFile(state_dir + "/fitrund.log").c_str());
    return 1;
  }
  std::printf("%d clients submit %d jobs (max_steps 1, instant worker, --devices=%s) while %d watchers follow;\n"
              "fitrund is SIGKILLed after acknowledged job %d (seed %llu) and started again.\n\n",
              clients, jobs, absl::GetFlag(FLAGS_devices).c_str(), watchers, kill_at,
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  Submissions submissions;
  // What each watcher followed (the watchers take the jobs as they are acknowledged).
  absl::Mutex queue_mu;
  std::vector<std::vector<std::unique_ptr<Followed>>> followed(watchers);
  std::vector<size_t> taken(watchers, 0);
  bool submitting_done = false;

  const absl::Time started = absl::Now();
  std::atomic<int> next{0};
  std::vector<std::thread> client_threads;
  for (int c = 0; c < clients; ++c) {
    client_threads.emplace_back([&, c] {
      auto stub = NewStub(address);
      for (int i = next.fetch_add(1); i < jobs; i = next.fetch_add(1)) {
        const std::string request_id = absl::StrCat("load-kill-", seed, "-", i);
        fitrun::v1::SubmitJobRequest request;
        request.set_spec_yaml(Spec());
        request.set_request_id(request_id);
        const absl::Time give_up = absl::Now() + kGiveUpAfter;
        while (true) {
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
          if (!user_tokens.empty()) Authorize(&context, user_tokens[static_cast<size_t>(c) % user_tokens.size()]);
          fitrun::v1::SubmitJobResponse response;
          const grpc::Status status = stub->SubmitJob(&context, request, &response);
          {
            absl::MutexLock lock(&submissions.mu);
            if (status.ok()) {
              auto [it, inserted] = submissions.job_of_request.emplace(request_id, response.job().id());
              if (!inserted && it->second != response.job().id()) ++submissions.duplicate_acknowledgements;
              if (inserted) submissions.acknowledged.push_back(response.job().id());
              break;
            }
            if (absl::Now() > give_up) {
              ++submissions.given_up;
              contract::LogError("gave up on %s: %s", request_id, status.error_message());
              break;
            }
            ++submissions.retries;
          }
          absl::SleepFor(absl::Milliseconds(20 + c));
        }
      }
    });
  }

  // The killer: once `kill_at` jobs are acknowledged, SIGKILL and restart.
  double killed_at_seconds = 0;
  double restart_ms = 0;
  std::thread killer([&] {
    const auto enough = [&] {
      return submissions.acknowledged.size() >= static_cast<size_t>(kill_at) || submissions.clients_done;
    };
    {
      absl::MutexLock lock(&submissions.mu);
      submissions.mu.Await(absl::Condition(&enough));
    }
    const absl::Time kill_time = absl::Now();
    killed_at_seconds = absl::ToDoubleSeconds(kill_time - started);
    daemon->Kill();
    daemon = start_daemon();
    if (daemon->WaitForAddress().empty()) {
      std::fprintf(stderr, "fitrund did not restart:\n%s\n", bench::ReadFile(state_dir + "/fitrund.log").c_str());
    }
    restart_ms = absl::ToDoubleMilliseconds(absl::Now() - kill_time);
  });

  std::vector<std::thread> watcher_threads;
  for (int w = 0; w < watchers; ++w) {
    watcher_threads.emplace_back([&, w] {
      while (true) {
        std::string job_id;
        {
          // Job i is followed by watchers i and i + watchers/2 (mod watchers).
          absl::MutexLock lock(&submissions.mu);
          const auto next_for_me = [&] {
            while (taken[w] < submissions.acknowledged.size()) {
              const size_t i = taken[w];
              if (static_cast<int>(i % watchers) == w || static_cast<int>((i + watchers / 2) % watchers) == w) return true;
              ++taken[w];
            }
            return submitting_done;
          };
          submissions.mu.Await(absl::Condition(&next_for_me));
          if (taken[w] >= submissions.acknowledged.size()) return;  // submitting is done
          job_id = submissions.acknowledged[taken[w]++];
        }
        auto one = std::make_unique<Followed>();
        one->job_id = job_id;
        Follow(address, one.get());
        absl::MutexLock lock(&queue_mu);
        followed[w].push_back(std::move(one));
      }
    });
  }

  for (std::thread& t : client_threads) t.join();
  const double submit_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  {
    absl::MutexLock lock(&submissions.mu);
    submissions.clients_done = true;
  }
  killer.join();
  {
    absl::MutexLock lock(&submissions.mu);
    submitting_done = true;
  }

  // Every job ends (or the check below says which did not).
  auto stub = NewStub(address);
  std::vector<Job> stored;
  const absl::Time give_up = absl::Now() + kGiveUpAfter;
  while (absl::Now() < give_up) {
    if (bench::ListAllJobs(*stub, &stored, admin_token) &&
        std::all_of(stored.begin(), stored.end(), [](const Job& j) { return IsTerminal(j.state()); })) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  const double all_ended_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  for (std::thread& t : watcher_threads) t.join();

  // Exactly once.
  std::map<std::string, int> stored_per_request;
  std::set<std::string> stored_ids;
  std::map<fitrun::v1::JobState, int> end_states;
  int not_ended = 0;
  std::map<std::string, int> failure_reasons;
  for (const Job& job : stored) {
    if (job.state() == fitrun::v1::JOB_STATE_FAILED) ++failure_reasons[job.failure_reason()];
    ++stored_per_request[job.request_id()];
    stored_ids.insert(job.id());
    if (IsTerminal(job.state())) {
      ++end_states[job.state()];
    } else {
      ++not_ended;
    }
  }
  int duplicated = submissions.duplicate_acknowledgements;
  for (const auto& [request_id, count] : stored_per_request) duplicated += count - 1;
  int lost = 0;
  for (const std::string& id : submissions.acknowledged) lost += stored_ids.count(id) == 0 ? 1 : 0;
  const int unacknowledged_stored = static_cast<int>(stored.size()) - static_cast<int>(submissions.acknowledged.size());

  // Every watcher's view against the stored history.
  std::map<std::string, std::vector<std::string>> histories;
  int streams = 0, reconnects = 0, gaps = 0, duplicates = 0, missed = 0, unfinished = 0, differing = 0;
  int64_t events_seen = 0;
  std::map<grpc::StatusCode, int> broken_by;
  for (auto& per_watcher : followed) {
    for (auto& one : per_watcher) {
      ++streams;
      reconnects += one->reconnects;
      for (const auto& [code, count] : one->broken_by) broken_by[code] += count;
      gaps += one->gaps;
      duplicates += one->duplicates;
      missed += one->missed_notices;
      unfinished += one->ended ? 0 : 1;
      events_seen += static_cast<int64_t>(one->events.size());
      auto it = histories.find(one->job_id);
      if (it == histories.end()) it = histories.emplace(one->job_id, History(*stub, one->job_id)).first;
      if (one->events != it->second) ++differing;
    }
  }
  int64_t history_events = 0;
  for (const auto& [id, events] : histories) history_events += static_cast<int64_t>(events.size());

  std::printf("| figure | value |\n| --- | ---: |\n");
  std::printf("| jobs submitted (request ids) | %d |\n", jobs);
  std::printf("| acknowledged | %zu |\n", submissions.acknowledged.size());
  std::printf("| submits retried after the kill | %d |\n", submissions.retries);
  std::printf("| given up | %d |\n", submissions.given_up);
  std::printf("| stored | %zu |\n", stored.size());
  std::printf("| duplicated | %d |\n", duplicated);
  std::printf("| lost (acknowledged, not stored) | %d |\n", lost);
  std::printf("| stored, never acknowledged | %d |\n", unacknowledged_stored);
  std::printf("| ended: succeeded / failed / cancelled | %d / %d / %d |\n", end_states[fitrun::v1::JOB_STATE_SUCCEEDED],
              end_states[fitrun::v1::JOB_STATE_FAILED], end_states[fitrun::v1::JOB_STATE_CANCELLED]);
  std::printf("| not ended | %d |\n", not_ended);
  for (const auto& [reason, count] : failure_reasons) std::printf("| failed: %s | %d |\n", reason.c_str(), count);
  std::printf("| watch streams (jobs x 2) / reconnects | %d / %d |\n", streams, reconnects);
  std::printf("| events seen by watchers / in the stored histories | %lld / %lld |\n",
              static_cast<long long>(events_seen), static_cast<long long>(history_events));
  for (const auto& [code, count] : broken_by) {
    std::printf("| watch streams ended early with status %d | %d |\n", static_cast<int>(code), count);
  }
  std::printf("| event gaps / duplicates / EventsMissed notices | %d / %d / %d |\n", gaps, duplicates, missed);
  std::printf("| watcher views differing from the stored history | %d |\n", differing);
  std::printf("| watchers that never saw their job end | %d |\n", unfinished);
  std::printf("| SIGKILL at / fitrund serving again after | %.2f s / %.0f ms |\n", killed_at_seconds, restart_ms);
  std::printf("| all acknowledged after / all ended after | %.1f s / %.1f s |\n", submit_seconds, all_ended_seconds);

  const bool ok = submissions.acknowledged.size() == static_cast<size_t>(jobs) && submissions.given_up == 0 &&
                  end_states[fitrun::v1::JOB_STATE_SUCCEEDED] == static_cast<int>(stored.size()) &&
                  duplicated == 0 && lost == 0 && unacknowledged_stored == 0 && not_ended == 0 && gaps == 0 &&
                  duplicates == 0 && missed == 0 && differing == 0 && unfinished == 0 && restart_ms > 0;
  std::printf("\n%s\n", ok ? "every invariant holds" : "AN INVARIANT FAILED (see the table)");
  daemon.reset();
  if (ok) std::filesystem::remove_all(state_dir);
  else std::printf("state directory kept: %s\n", state_dir.c_str());
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace fitrun::server

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fitrun::server::Run();
}
