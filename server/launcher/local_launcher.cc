#include "server/launcher/local_launcher.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"

namespace fitrun::server {

namespace launch = fitrun::contract::launch;

LocalLauncher::LocalLauncher(std::function<absl::StatusOr<int>()> pick_master_port)
    : LocalLauncher([&] {
        Options options;
        options.pick_master_port = std::move(pick_master_port);
        return options;
      }()) {}

LocalLauncher::LocalLauncher(Options options) : options_(std::move(options)) {
  if (options_.cgroups != nullptr) releaser_ = std::thread([this] { ReleaserLoop(); });
  if (options_.warm_ranks > 0) {
    warm_ = std::make_unique<WarmRanks>(&processes_, WarmRanks::Options{options_.worker_binary, options_.warm_ranks});
  }
}

int64_t LocalLauncher::IdleHostBytes() const { return warm_ != nullptr ? warm_->IdleHostBytes() : 0; }

void LocalLauncher::ReleaseIdle() {
  if (warm_ != nullptr) warm_->Close();
}

LocalLauncher::~LocalLauncher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (releaser_.joinable()) releaser_.join();
  // What the releaser had not done, or must try again, and every attempt still held.
  std::deque<std::shared_ptr<AttemptCgroup>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(to_release_);
    for (auto& [handle, attempt] : cgroups_) left.push_back(attempt);
    cgroups_.clear();
  }
  // Everything the attempts started goes with fitrund (the ranks themselves too: ProcessLauncher's
  // waiters then reap them). What cannot be emptied now stays for the next fitrund's
  // ReleaseUnowned.
  for (const std::shared_ptr<AttemptCgroup>& attempt : left) {
    if (absl::Status released = options_.kill_and_remove(*attempt->cgroup); !released.ok()) {
      contract::LogWarning("%s; the next fitrund removes it", released.message());
    }
  }
  if (options_.cgroups != nullptr && options_.cgroups->List().empty()) (void)options_.cgroups->RemoveDirectories();
}

absl::StatusOr<LaunchedAttempt> LocalLauncher::Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) {
  std::unique_ptr<RendezvousStore> store;
  absl::StatusOr<int> port = absl::UnknownError("no rendezvous");
  if (options_.pick_master_port) {
    port = options_.pick_master_port();
  } else {
    RendezvousStore::Options store_options;
    const bool as_account = !attempt.ranks.empty() && attempt.ranks.front().run_as.has_value();
    store_options.uid = as_account ? attempt.ranks.front().run_as->uid : geteuid();
    store_options.name = absl::StrCat(attempt.job_id, " attempt ", attempt.attempt);
    absl::StatusOr<std::unique_ptr<RendezvousStore>> started = RendezvousStore::Start(store_options);
    if (started.ok()) {
      store = *std::move(started);
      port = store->port();
    } else {
      port = started.status();
    }
  }
  if (!port.ok()) return port.status();
  LaunchedAttempt launched;
  std::shared_ptr<AttemptCgroup> cgroup;
  std::vector<std::string> procs_files;
  if (options_.cgroups != nullptr) {
    const absl::Time cgroup_start = absl::Now();
    absl::StatusOr<std::unique_ptr<JobCgroup>> made = options_.cgroups->Make(
        AttemptCgroupName(attempt.job_id, attempt.attempt), {attempt.host_memory_limit_bytes, attempt.max_processes});
    if (!made.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("the attempt's cgroup: ", made.status().message()));
    }
    cgroup = std::make_shared<AttemptCgroup>();
    cgroup->cgroup = *std::move(made);
    // A cgroup reused after a coordinator's death may have counted kills of its own.
    absl::StatusOr<int64_t> kills = cgroup->cgroup->HostMemoryOomKills();
    absl::MutexLock lock(&cgroup->mu);
    cgroup->oom_kills_reported = kills.ok() ? *kills : 0;
    procs_files = cgroup->cgroup->ProcsFiles();
    launched.phases.push_back({"cgroup", absl::Now() - cgroup_start});
  }
  const absl::Time spawn_start = absl::Now();
  launched.master_addr = "127.0.0.1";
  launched.master_port = *port;
  // Set when the attempt could not start whole: the ranks already started are killed and their
  // exits are not reported (the caller was told the attempt never started).
  auto abandoned = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::string> warm_ids(attempt.ranks.size());
  std::vector<int64_t> start_ticks;
  for (size_t rank = 0; rank < attempt.ranks.size(); ++rank) {
    WorkerLaunch one = attempt.ranks[rank];
    one.env.emplace_back(launch::kMasterAddr, launched.master_addr);
    one.env.emplace_back(launch::kMasterPort, absl::StrCat(launched.master_port));
    if (store != nullptr) {
      one.env.emplace_back(launch::kUseAgentStore, "True");
      one.env.emplace_back(launch::kRestartCount, absl::StrCat(std::max(0, attempt.attempt - 1)));
    }
    ProcessLauncher::ExitCallback on_rank_exit = [on_exit, abandoned, rank, cgroup](const WorkerExit& exit) {
      if (abandoned->load()) return;
      WorkerExit seen = exit;
      if (cgroup != nullptr) NoteHostMemory(*cgroup, seen);
      on_exit(static_cast<int>(rank), seen);
    };
    std::optional<WarmRanks::Taken> warm =
        warm_ != nullptr ? warm_->Take(one, on_rank_exit, cgroup != nullptr ? cgroup->cgroup.get() : nullptr)
                         : std::nullopt;
    if (warm.has_value()) {
      warm_ids[rank] = warm->warm_id;
      ++launched.warm_ranks;
    }
    absl::StatusOr<int> pid = warm.has_value() ? warm->pid : processes_.Launch(one, on_rank_exit, procs_files);
    if (!pid.ok()) {
      abandoned->store(true);
      for (int started : launched.pids) processes_.KillIfStillRunningAfter(started, absl::ZeroDuration());
      if (cgroup != nullptr) Queue(cgroup);
      return absl::Status(pid.status().code(), absl::StrCat("rank ", rank, ": ", pid.status().message()));
    }
    launched.pids.push_back(*pid);
    // Read while the launcher has not reaped it: the pid is still this rank's.
    start_ticks.push_back(ProcessStartTicks(*pid));
  }
  // Each rank's fork, its switch to the job's account and its exec, as ProcessLauncher waits for them.
  launched.phases.push_back({"spawn", absl::Now() - spawn_start});
  launched.handle = LocalLaunchHandle(launched.pids, warm_ids, start_ticks);
  if (warm_ != nullptr && !attempt.ranks.empty()) {
    absl::MutexLock lock(&mu_);
    refill_on_release_.emplace(launched.handle, std::make_pair(attempt.ranks[0], static_cast<int>(attempt.ranks.size())));
  }
  if (cgroup != nullptr || store != nullptr) {
    absl::MutexLock lock(&mu_);
    if (cgroup != nullptr) cgroups_[launched.handle] = cgroup;
    if (store != nullptr) stores_[launched.handle] = std::move(store);
  }
  return launched;
}

int LocalLauncher::PidOf(const std::string& handle, int rank) {
  absl::StatusOr<std::vector<int>> pids = PidsInLocalLaunchHandle(handle);
  if (!pids.ok() || rank < 0 || rank >= static_cast<int>(pids->size())) {
    contract::LogError("no rank %d in launch handle '%s'", rank, handle);
    return 0;
  }
  return (*pids)[rank];
}

void LocalLauncher::Stop(const std::string& handle, int rank, absl::Duration grace) {
  if (const int pid = PidOf(handle, rank); pid > 0) processes_.Stop(pid, grace);
}

void LocalLauncher::KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration grace) {
  if (const int pid = PidOf(handle, rank); pid > 0) processes_.KillIfStillRunningAfter(pid, grace);
}

std::vector<bool> LocalLauncher::Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) {
  std::shared_ptr<AttemptCgroup> cgroup;
  if (options_.cgroups != nullptr) {
    absl::StatusOr<std::unique_ptr<JobCgroup>> opened =
        options_.cgroups->Open(AttemptCgroupName(attempt.job_id, attempt.attempt));
    if (opened.ok()) {
      cgroup = std::make_shared<AttemptCgroup>();
      cgroup->cgroup = *std::move(opened);
      // Kills before now happened while nobody watched; the next exit reports only new ones.
      absl::StatusOr<int64_t> kills = cgroup->cgroup->HostMemoryOomKills();
      {
        absl::MutexLock lock(&cgroup->mu);
        cgroup->oom_kills_reported = kills.ok() ? *kills : 0;
      }
      absl::MutexLock lock(&mu_);
      cgroups_[attempt.handle] = cgroup;
    } else if (!absl::IsNotFound(opened.status())) {
      contract::LogError("job %s attempt %d: %s", attempt.job_id, attempt.attempt, opened.status().message());
    }
  }
  std::vector<bool> adopted(attempt.pids.size(), false);
  // A warm rank's environment is the pool's, not its job's: its handle names the id it carries.
  const std::vector<std::string> warm_ids = WarmIdsInLocalLaunchHandle(attempt.handle).value_or(std::vector<std::string>());
  const std::vector<int64_t> start_ticks =
      StartTicksInLocalLaunchHandle(attempt.handle).value_or(std::vector<int64_t>());
  for (size_t rank = 0; rank < attempt.pids.size(); ++rank) {
    if (rank >= attempt.maybe_running.size() || !attempt.maybe_running[rank] || attempt.pids[rank] <= 0) continue;
    const bool warm = rank < warm_ids.size() && !warm_ids[rank].empty();
    // Whatever its environment says (any account can start a process with that environment, and
    // get the pid once the rank is gone): the job's account, the start recorded at launch, and the
    // attempt's cgroup when there is one.
    ProcessLauncher::Identity identity;
    identity.env = {{launch::kJobId, attempt.job_id},
                    {launch::kAttempt, absl::StrCat(attempt.attempt)},
                    {launch::kRank, absl::StrCat(rank)}};
    if (warm) identity.env = {{launch::kWarmRank, warm_ids[rank]}};
    identity.uid = attempt.run_as.has_value() ? attempt.run_as->uid : geteuid();
    identity.start_ticks = rank < start_ticks.size() ? start_ticks[rank] : 0;
    if (cgroup != nullptr) identity.in_cgroup = [cgroup](int pid) { return cgroup->cgroup->Contains(pid); };
    absl::StatusOr<int> pid = processes_.Adopt(
        attempt.pids[rank], identity,
        [on_exit, rank, cgroup](const WorkerExit& exit) {
          WorkerExit seen = exit;
          if (cgroup != nullptr) NoteHostMemory(*cgroup, seen);
          on_exit(static_cast<int>(rank), seen);
        });
    if (!pid.ok() && !absl::StrContains(pid.status().message(), "is gone")) {
      contract::LogError("job %s attempt %d rank %d: not re-adopted: %s", attempt.job_id, attempt.attempt, rank,
                        pid.status().message());
    }
    adopted[rank] = pid.ok();
  }
  return adopted;
}

void LocalLauncher::NoteHostMemory(AttemptCgroup& attempt, WorkerExit& exit) {
  absl::StatusOr<HostMemoryStats> memory = attempt.cgroup->HostMemory();
  if (!memory.ok()) return;
  // What fitrund measured itself, whatever the ranks report (it bounds their peaks).
  exit.host_memory_limit_bytes = memory->limit_bytes;
  exit.host_memory_peak_bytes = memory->peak_bytes;
  absl::MutexLock lock(&attempt.mu);
  if (memory->oom_kills <= attempt.oom_kills_reported) return;
  attempt.oom_kills_reported = memory->oom_kills;
  exit.host_memory_oom = true;
}

void LocalLauncher::Release(const std::string& handle) {
  std::shared_ptr<AttemptCgroup> cgroup;
  std::unique_ptr<RendezvousStore> store;  // closed here, off the lock
  {
    absl::MutexLock lock(&mu_);
    if (auto held = stores_.find(handle); held != stores_.end()) {
      store = std::move(held->second);
      stores_.erase(held);
    }
    // The next job of this account finds as many ranks warm (built-in jobs only; see warm_ranks.h).
    // Started now, not at launch: loading LibTorch beside a job's starting ranks would slow them.
    if (auto refill = refill_on_release_.find(handle); refill != refill_on_release_.end()) {
      warm_->Refill(refill->second.first, refill->second.second);
      refill_on_release_.erase(refill);
    }
    auto it = cgroups_.find(handle);
    if (it == cgroups_.end()) return;
    cgroup = std::move(it->second);
    cgroups_.erase(it);
  }
  Queue(std::move(cgroup));
}

void LocalLauncher::ReleaseUnowned(const std::vector<std::string>& owned_handles) {
  (void)owned_handles;  // the cgroups an attempt holds are those Launch and Adopt took
  if (options_.cgroups == nullptr) return;
  std::set<std::string> held;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [handle, attempt] : cgroups_) held.insert(attempt->cgroup->name());
  }
  // This fitrund's own probes are named for its pid, and are its own to remove.
  const std::string own_probes = absl::StrCat("probe-", getpid(), "-");
  for (const std::string& name : options_.cgroups->List()) {
    if (held.count(name) || absl::StartsWith(name, own_probes)) continue;
    absl::StatusOr<std::unique_ptr<JobCgroup>> stale = options_.cgroups->Open(name);
    if (!stale.ok()) continue;
    contract::LogInfo("removing the cgroup %s: no running attempt of this coordinator holds it", name);
    auto attempt = std::make_shared<AttemptCgroup>();
    attempt->cgroup = *std::move(stale);
    Queue(std::move(attempt));
  }
}

void LocalLauncher::Queue(std::shared_ptr<AttemptCgroup> attempt) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && releaser_.joinable()) {
      attempt->release_at = absl::InfinitePast();
      attempt->backoff = options_.retry_after;
      to_release_.push_back(std::move(attempt));
      return;
    }
  }
  // Stopping: released here and now, once.
  if (absl::Status released = options_.kill_and_remove(*attempt->cgroup); !released.ok()) {
    contract::LogError("%s", released.message());
  }
}

void LocalLauncher::ReleaserLoop() {
  while (true) {
    std::shared_ptr<AttemptCgroup> next;
    {
      absl::MutexLock lock(&mu_);
      while (next == nullptr) {
        if (stopping_) return;  // the destructor releases what is left
        const absl::Time now = absl::Now();
        absl::Time wake = absl::InfiniteFuture();
        for (auto it = to_release_.begin(); it != to_release_.end(); ++it) {
          if ((*it)->release_at <= now) {
            next = std::move(*it);
            to_release_.erase(it);
            break;
          }
          wake = std::min(wake, (*it)->release_at);
        }
        if (next != nullptr) break;
        const size_t queued = to_release_.size();
        auto changed = [this, queued]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stopping_ || to_release_.size() != queued;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), wake);
      }
    }
    const absl::Status released = options_.kill_and_remove(*next->cgroup);
    if (released.ok()) continue;
    // Not empty yet (a process stuck in the kernel, a fork racing the kill): tried again later,
    // until it is gone.
    contract::LogWarning("%s; trying again in %s", released.message(), absl::FormatDuration(next->backoff));
    absl::MutexLock lock(&mu_);
    next->release_at = absl::Now() + next->backoff;
    next->backoff = std::min(next->backoff * 2, options_.max_retry_after);
    to_release_.push_back(std::move(next));
  }
}

absl::Status LocalLauncher::KillAndRemove(JobCgroup& cgroup) {
  if (absl::Status killed = cgroup.KillAll(); !killed.ok()) return killed;
  return cgroup.Remove();
}

}  // namespace fitrun::server
