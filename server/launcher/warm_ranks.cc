#include "server/launcher/warm_ranks.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"
#include "server/spawn/spawn.h"

namespace fitrun::server {
namespace {

// How long a warm rank has to take its identity: it is waiting for it, so a pipe that does not
// take a few kilobytes in this time is one its owner stopped or filled.
constexpr absl::Duration kIdentityDeadline = absl::Seconds(2);

namespace launch = fitrun::contract::launch;

// What launch_contract.h's kWarmFd carries: the working directory, the log, each variable, an empty
// entry, then the token.
std::string IdentityMessage(const WorkerLaunch& launch) {
  std::string message;
  auto entry = [&message](const std::string& text) {
    message.append(text);
    message.push_back('\0');
  };
  entry(launch.working_dir);
  entry(launch.log_path);
  for (const auto& [key, value] : launch.env) entry(absl::StrCat(key, "=", value));
  message.push_back('\0');
  message.append(launch.job_token);
  return message;
}

// The process's anonymous resident memory (/proc/<pid>/status RssAnon), 0 when unknown: what it
// holds that no other process shares and the kernel cannot drop.
int64_t AnonymousResidentBytes(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) != 0) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (fields.size() >= 2 && absl::SimpleAtoi(fields[1], &kib)) return kib * 1024;
  }
  return 0;
}

std::string NewWarmId() {
  std::random_device entropy;
  return absl::StrFormat("%08x%08x", entropy(), entropy());
}

}  // namespace

WarmRanks::WarmRanks(ProcessLauncher* processes, Options options)
    : processes_(processes), options_(std::move(options)) {
  starter_ = std::thread([this] { StarterLoop(); });
}

WarmRanks::~WarmRanks() {
  Close();
  starter_.join();
}

void WarmRanks::Close() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (const std::shared_ptr<Rank>& rank : idle_) LetGo(*rank);
  idle_.clear();
  requests_.clear();
}

bool WarmRanks::SameAccount(const std::optional<UnixAccount>& a, const std::optional<UnixAccount>& b) {
  if (a.has_value() != b.has_value()) return false;
  // Groups too: a rank started before the account's groups changed keeps the old ones.
  return !a.has_value() || (a->uid == b->uid && a->gid == b->gid && a->groups == b->groups);
}

bool WarmRanks::Keeps(const WorkerLaunch& launch) const {
  return launch.argv.size() == 1 && launch.argv[0] == options_.worker_binary;
}

void WarmRanks::LetGo(Rank& rank) { CloseFd(&rank.identity_fd); }

void WarmRanks::DropExitedLocked() {
  for (auto it = idle_.begin(); it != idle_.end();) {
    bool exited;
    {
      absl::MutexLock lock(&(*it)->mu);
      exited = (*it)->exited;
    }
    if (exited) {
      LetGo(**it);
      it = idle_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<WarmRanks::Taken> WarmRanks::Take(const WorkerLaunch& launch, ProcessLauncher::ExitCallback on_exit,
                                                const JobCgroup* cgroup) {
  if (!Keeps(launch)) return std::nullopt;
  while (true) {
    std::shared_ptr<Rank> rank;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return std::nullopt;
      DropExitedLocked();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (SameAccount((*it)->account, launch.run_as)) {
          rank = *it;
          idle_.erase(it);
          break;
        }
      }
    }
    if (rank == nullptr) return std::nullopt;
    if (cgroup != nullptr) {
      // While the launcher cannot reap it, so the pid written is this rank's and no recycled one's.
      if (absl::Status moved = processes_->WhileAlive(rank->pid, [&] { return cgroup->MoveIn(rank->pid); });
          !moved.ok()) {
        contract::LogWarning("warm rank %d: %s; starting the rank cold", rank->pid, moved.message());
        LetGo(*rank);
        return std::nullopt;
      }
    }
    {
      absl::MutexLock lock(&rank->mu);
      if (rank->exited) {  // died idle: forget it and look again
        LetGo(*rank);
        continue;
      }
      rank->on_exit = on_exit;
    }
    // From here the rank is the job's: if the write fails it has died, and its exit, already routed
    // to the job, is that rank's crash. The rank runs as the job's owner, who may have stopped it or
    // filled its pipe (the job's launch waits here): one that does not take its identity in time
    // is killed, which is the same crash.
    if (!WriteToPipeWithin(rank->identity_fd, IdentityMessage(launch), kIdentityDeadline).ok()) {
      processes_->KillNow(rank->pid);  // through its pidfd: never a process that took its pid
    }
    LetGo(*rank);
    return Taken{rank->pid, rank->warm_id};
  }
}

void WarmRanks::Refill(const WorkerLaunch& launch, int count) {
  if (options_.capacity <= 0 || count <= 0 || !Keeps(launch)) return;
  absl::MutexLock lock(&mu_);
  if (!stopping_) requests_.push_back({launch.run_as, std::min(count, options_.capacity)});
}

void WarmRanks::StarterLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !requests_.empty(); };
    mu_.Await(absl::Condition(&ready));
    if (stopping_) return;
    const Request request = requests_.front();
    requests_.pop_front();
    DropExitedLocked();
    int have = 0;
    for (const std::shared_ptr<Rank>& rank : idle_) have += SameAccount(rank->account, request.account) ? 1 : 0;
    for (; have < request.count; ++have) {
      // Room first: the longest idle rank of another account goes.
      if (static_cast<int>(idle_.size()) >= options_.capacity) {
        auto other = std::find_if(idle_.begin(), idle_.end(), [&](const std::shared_ptr<Rank>& rank) {
          return !SameAccount(rank->account, request.account);
        });
        if (other == idle_.end()) break;
        LetGo(**other);
        idle_.erase(other);
      }
      auto rank = std::make_shared<Rank>();
      rank->account = request.account;
      rank->warm_id = NewWarmId();
      mu_.Unlock();  // starting a process takes milliseconds; Take must not wait for it
      absl::StatusOr<ProcessLauncher::Warm> started = processes_->StartWarm(
          {options_.worker_binary}, request.account, rank->warm_id, [rank](const WorkerExit& exit) {
            ProcessLauncher::ExitCallback on_exit;
            {
              absl::MutexLock lock(&rank->mu);
              rank->exited = true;
              on_exit = rank->on_exit;
            }
            if (on_exit) on_exit(exit);
          });
      mu_.Lock();
      if (!started.ok()) {
        contract::LogWarning("cannot start a warm rank: %s", started.status().message());
        break;
      }
      rank->pid = started->pid;
      rank->identity_fd = started->identity_fd;
      if (stopping_) {
        LetGo(*rank);
        return;
      }
      idle_.push_back(std::move(rank));
    }
  }
}

int64_t WarmRanks::IdleHostBytes() const {
  std::vector<int> pids;
  {
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<Rank>& rank : idle_) pids.push_back(rank->pid);
  }
  int64_t bytes = 0;
  for (int pid : pids) bytes += AnonymousResidentBytes(pid);
  return bytes;
}

}  // namespace fitrun::server
