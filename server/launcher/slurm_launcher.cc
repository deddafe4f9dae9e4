#include "server/launcher/slurm_launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"
#include "server/sandbox/owned_directory.h"
#include "server/slurm/slurm_text.h"

namespace fitrun::server {
namespace {

namespace launch = fitrun::contract::launch;
namespace fs = std::filesystem;

// worker/slurm/rank_shim.sh, written beside each attempt's batch script.
constexpr char kRankShim[] =
#include "server/launcher/rank_shim.sh.inc"
    ;

// A copy of a batch script that only root reads, for sbatch (which runs as root and opens the file
// it is named, following links): the copy in the attempt's directory is the owner's, who may swap it
// for a link to a root-only file (whose text Slurm would then keep as the job's script) or a FIFO.
// Created exclusively (mkstemp: 0600, never through an existing name); removed with this object.
class PrivateScript {
 public:
  static absl::StatusOr<PrivateScript> Write(const std::string& text) {
    std::string path = (fs::temp_directory_path() / "fitrun-sbatch-XXXXXX").string();
    const int fd = mkstemp(path.data());
    if (fd < 0) return absl::InternalError(absl::StrCat("sbatch's copy of the batch script: ", std::strerror(errno)));
    PrivateScript script(path);
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fd);
        return absl::InternalError(absl::StrCat("writing ", path, ": ", std::strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    close(fd);
    return script;
  }
  PrivateScript(PrivateScript&& other) noexcept : path_(std::exchange(other.path_, "")) {}
  PrivateScript& operator=(PrivateScript&&) = delete;
  ~PrivateScript() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  explicit PrivateScript(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

constexpr char kHandlePrefix[] = "slurm:";
// The shim tells fitrund each rank's exit status through files in this directory.
constexpr char kExitDirVariable[] = "FITRUN_EXIT_DIR";

// The variables the shim sets per rank from Slurm's; everything else must be the same for every rank.
bool SetByShim(const std::string& name) {
  return name == launch::kRank || name == launch::kLocalRank || name == launch::kWorldSize ||
         name == launch::kLocalWorldSize;
}

// `value` as one word of a POSIX shell command.
std::string ShellQuote(const std::string& value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// A rank's exit status as the shim recorded it, if it has: read as the ranks' account, through no
// symlink, a few bytes of a regular file at most (the ranks may have put anything there).
std::optional<int> ReadExitFile(const std::string& job_dir, const std::string& attempt_dir_name,
                                const std::optional<UnixAccount>& run_as, int rank) {
  absl::StatusOr<OwnedDirectory> dir = OwnedDirectory::Open(job_dir, run_as, /*create=*/false);
  if (!dir.ok()) return std::nullopt;
  absl::StatusOr<UntrustedFile> file = dir->OpenForReading(absl::StrCat(attempt_dir_name, "/rank-", rank, ".exit"));
  if (!file.ok()) return std::nullopt;
  absl::StatusOr<std::string> text = file->ReadAt(0, 32);
  int code = 0;
  if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &code)) return std::nullopt;
  return code;
}

// "PENDING (Resources)", "RUNNING", "NODE_FAIL (...)".
std::string Describe(const slurm::SlurmJobStatus& status) {
  std::string text = status.state;
  if (!status.reason.empty()) absl::StrAppend(&text, " (", status.reason, ")");
  return text;
}

}  // namespace

std::string SlurmLauncher::CoordinatorTag(const std::string& host, const std::string& state_dir) {
  // FNV-1a: stable across builds and restarts, unlike std::hash.
  uint64_t hash = 1469598103934665603ULL;
  for (char c : absl::StrCat(host, ":", state_dir)) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, hash);
  return absl::StrCat("fitrund-", hex);
}

std::string SlurmLauncher::HandleOf(const std::string& slurm_job_id) { return kHandlePrefix + slurm_job_id; }

absl::StatusOr<std::string> SlurmLauncher::SlurmJobIdOf(const std::string& handle) {
  absl::string_view id = handle;
  if (!absl::ConsumePrefix(&id, kHandlePrefix) || id.empty() ||
      !std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return absl::InvalidArgumentError(absl::StrCat("'", handle, "' is not a Slurm launch handle (slurm:<job id>)"));
  }
  return std::string(id);
}

absl::StatusOr<std::string> SlurmLauncher::BatchScript(const AttemptLaunch& attempt, const std::string& shim) {
  if (attempt.ranks.empty()) return absl::InvalidArgumentError("an attempt needs at least one rank");
  const WorkerLaunch& first = attempt.ranks.front();
  std::map<std::string, std::string> shared;
  for (const auto& [name, value] : first.env) {
    if (!SetByShim(name)) shared[name] = value;
  }
  for (const WorkerLaunch& rank : attempt.ranks) {
    std::map<std::string, std::string> env;
    for (const auto& [name, value] : rank.env) {
      if (!SetByShim(name)) env[name] = value;
    }
    if (env != shared || rank.argv != first.argv || rank.working_dir != first.working_dir ||
        rank.job_token != first.job_token) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank.rank, " differs from rank 0 in more than its torchrun variables; one srun step runs them all"));
    }
  }
  const std::string attempt_dir = first.working_dir;
  std::string script = absl::StrCat(
      "#!/bin/bash\n",
      "# fitrun job ", attempt.job_id, ", attempt ", attempt.attempt,
      ": every rank in one srun step, each under the rank shim.\n",
      "set -u\n",
      "# The time limit is near (sbatch --signal=B:USR2@...): the ranks keep their periodic checkpoints.\n",
      "trap 'echo \"fitrun: Slurm gave notice (SIGUSR2): the allocation ends soon\" >&2' USR2\n");
  // A batch script can hand the token over only in the environment (launch_contract.h): the script
  // and the allocation's processes are the job's account's, so this job's peaks teach only that
  // account's plans (memory_calibration.h).
  if (!first.job_token.empty()) shared[launch::kJobToken] = first.job_token;
  if (first.run_as.has_value()) {
    // What a login of the account would set, over fitrund's own.
    shared.emplace("HOME", first.run_as->home);
    shared.emplace("USER", first.run_as->name);
    shared.emplace("LOGNAME", first.run_as->name);
  }
  for (const auto& [name, value] : shared) absl::StrAppend(&script, "export ", name, "=", ShellQuote(value), "\n");
  absl::StrAppend(&script, "export ", kExitDirVariable, "=", ShellQuote(attempt_dir), "\n");
  absl::StrAppend(
      &script,
      "# The rendezvous: rank 0 runs on the first node, whose name need not resolve; its NodeAddr does.\n",
      "first_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n",
      "MASTER_ADDR=$(scontrol show node --oneliner \"$first_node\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')\n",
      "export MASTER_ADDR=${MASTER_ADDR:-$first_node}\n",
      "# Unique among running jobs (Slurm's ids are), below Linux's ephemeral ports.\n",
      "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n",
      "cd ", ShellQuote(attempt_dir), " || exit 2\n",
      "srun --kill-on-bad-exit=1 --output=", ShellQuote(attempt_dir + "/rank-%t.log"), " ", ShellQuote(shim));
  for (const std::string& arg : first.argv) absl::StrAppend(&script, " ", ShellQuote(arg));
  absl::StrAppend(&script,
                  " &\n",
                  "step=$!\n",
                  "# A trapped signal ends `wait` early: wait until the step is over.\n",
                  "wait \"$step\"\n",
                  "status=$?\n",
                  "while kill -0 \"$step\" 2>/dev/null; do wait \"$step\"; status=$?; done\n",
                  "exit \"$status\"\n");
  return script;
}

std::vector<std::string> SlurmLauncher::SbatchArgv(const AttemptLaunch& attempt, const std::string& script) const {
  const int world_size = static_cast<int>(attempt.ranks.size());
  const int nodes = attempt.nodes.empty() ? 1 : static_cast<int>(attempt.nodes.size());
  const int per_node = attempt.ranks_per_node > 0 ? attempt.ranks_per_node : world_size / nodes;
  // The ranks' working directory is the attempt's (the script sbatch reads is elsewhere).
  const std::string attempt_dir = attempt.ranks.empty() ? "" : attempt.ranks.front().working_dir;
  std::vector<std::string> argv = {
      "sbatch",
      "--parsable",
      absl::StrCat("--job-name=fitrun-", attempt.job_id),
      absl::StrCat("--comment=", options_.coordinator_tag),
      absl::StrCat("--nodes=", nodes),
      absl::StrCat("--ntasks-per-node=", per_node),
      absl::StrCat("--cpus-per-task=", std::max(1, attempt.cpus_per_rank)),
      "--no-requeue",
      absl::StrCat("--signal=B:USR2@", std::max<int64_t>(1, absl::ToInt64Seconds(options_.preemption_notice))),
      absl::StrCat("--output=", attempt_dir, "/slurm-batch.log"),
      absl::StrCat("--chdir=", attempt_dir),
  };
  if (!attempt.nodes.empty()) argv.push_back(absl::StrCat("--nodelist=", absl::StrJoin(attempt.nodes, ",")));
  if (attempt.gpu_per_rank) argv.push_back("--gpus-per-task=1");
  if (attempt.memory_per_rank_bytes > 0) {
    const int64_t mib = (attempt.memory_per_rank_bytes * per_node + (1 << 20) - 1) >> 20;
    argv.push_back(absl::StrCat("--mem=", mib, "M"));
  }
  if (attempt.time_limit_minutes > 0) argv.push_back(absl::StrCat("--time=", attempt.time_limit_minutes));
  if (!options_.partition.empty()) argv.push_back(absl::StrCat("--partition=", options_.partition));
  if (!options_.account.empty()) argv.push_back(absl::StrCat("--account=", options_.account));
  // A job that runs as its owner: fitrund (root) submits it as that account, so slurmd starts the
  // batch step and every rank with the account's ids, and Slurm accounts the job to it. (sbatch
  // passes it fitrund's environment, as for every job here: the batch script sets the account's
  // HOME, USER and LOGNAME over it.)
  if (!attempt.ranks.empty() && attempt.ranks.front().run_as.has_value()) {
    const UnixAccount& owner = *attempt.ranks.front().run_as;
    argv.push_back(absl::StrCat("--uid=", owner.uid));
    argv.push_back(absl::StrCat("--gid=", owner.gid));
  }
  argv.insert(argv.end(), options_.extra_sbatch_args.begin(), options_.extra_sbatch_args.end());
  argv.push_back(script);
  return argv;
}

SlurmLauncher::SlurmLauncher(Options options) : options_([&] {
  if (!options.runner) options.runner = slurm::RealSlurmRunner();
  return std::move(options);
}()) {
  poller_ = std::thread([this] { PollLoop(); });
}

SlurmLauncher::~SlurmLauncher() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  poller_.join();
}

absl::StatusOr<LaunchedAttempt> SlurmLauncher::Launch(const AttemptLaunch& attempt, RankExitCallback on_exit) {
  if (attempt.ranks.empty()) return absl::InvalidArgumentError("an attempt needs at least one rank");
  const fs::path attempt_dir = attempt.ranks.front().working_dir;
  const fs::path shim = attempt_dir / "rank_shim.sh";
  absl::StatusOr<std::string> script = BatchScript(attempt, shim.string());
  if (!script.ok()) return script.status();
  // The attempt's directory is the ranks' account's: what goes there is written as it, through no
  // symlink. The script holds the job's token: only its owner reads it.
  const std::optional<UnixAccount>& run_as = attempt.ranks.front().run_as;
  absl::StatusOr<OwnedDirectory> job_dir = OwnedDirectory::Open(attempt.job_dir, run_as, /*create=*/false);
  if (!job_dir.ok()) return job_dir.status();
  const std::string in_attempt = attempt.attempt_dir_name + "/";
  if (absl::Status status = job_dir->WriteFile(in_attempt + "rank_shim.sh", kRankShim, 0755); !status.ok()) {
    return status;
  }
  if (absl::Status status = job_dir->WriteFile(in_attempt + "slurm-batch.sh", *script, 0700); !status.ok()) {
    return status;
  }
  for (int rank = 0; rank < static_cast<int>(attempt.ranks.size()); ++rank) {
    if (absl::Status status = job_dir->RemoveFile(absl::StrCat(in_attempt, "rank-", rank, ".exit")); !status.ok()) {
      return status;
    }
  }

  absl::StatusOr<PrivateScript> private_script = PrivateScript::Write(*script);
  if (!private_script.ok()) return private_script.status();
  absl::StatusOr<std::string> submitted = options_.runner(SbatchArgv(attempt, private_script->path()));
  if (!submitted.ok()) {
    if (absl::IsDeadlineExceeded(submitted.status())) {
      // slurmctld may have queued it before sbatch was cut off; nobody would own that allocation.
      absl::MutexLock lock(&mu_);
      sweep_orphans_ = true;
      wake_ = true;
    }
    return absl::Status(submitted.status().code(), absl::StrCat("sbatch: ", submitted.status().message()));
  }
  absl::StatusOr<std::string> job_id = slurm::ParseSbatchParsable(*submitted);
  if (!job_id.ok()) return job_id.status();

  Tracked tracked;
  tracked.job_dir = attempt.job_dir;
  tracked.attempt_dir_name = attempt.attempt_dir_name;
  tracked.run_as = run_as;
  tracked.world_size = static_cast<int>(attempt.ranks.size());
  tracked.on_exit = std::move(on_exit);
  tracked.on_allocation = attempt.on_allocation;
  tracked.reported.assign(tracked.world_size, false);
  Track(*job_id, std::move(tracked));
  contract::LogInfo("job %s attempt %d: Slurm job %s (%d ranks)", attempt.job_id, attempt.attempt, *job_id,
                    attempt.ranks.size());

  LaunchedAttempt launched;
  launched.handle = HandleOf(*job_id);
  launched.pids.assign(attempt.ranks.size(), 0);
  return launched;
}

void SlurmLauncher::Track(const std::string& job_id, Tracked tracked) {
  absl::MutexLock lock(&mu_);
  tracked_[job_id] = std::move(tracked);
  wake_ = true;
}

void SlurmLauncher::Stop(const std::string& handle, int rank, absl::Duration grace) {
  (void)rank;
  ScheduleStop(handle, grace, /*signal_first=*/true);
}

void SlurmLauncher::KillIfStillRunningAfter(const std::string& handle, int rank, absl::Duration grace) {
  (void)rank;
  ScheduleStop(handle, grace, /*signal_first=*/false);
}

void SlurmLauncher::ScheduleStop(const std::string& handle, absl::Duration grace, bool signal_first) {
  absl::StatusOr<std::string> job_id = SlurmJobIdOf(handle);
  if (!job_id.ok()) return;
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(*job_id);
  if (it == tracked_.end()) return;
  if (signal_first) it->second.stop_requested = true;
  const absl::Time cancel_at = absl::Now() + grace;
  if (!it->second.cancel_at || cancel_at < *it->second.cancel_at) it->second.cancel_at = cancel_at;
  wake_ = true;
}

std::vector<bool> SlurmLauncher::Adopt(const RecordedAttempt& attempt, RankExitCallback on_exit) {
  const int world_size = static_cast<int>(attempt.maybe_running.size());
  std::vector<bool> adopted(world_size, false);
  absl::StatusOr<std::string> job_id = SlurmJobIdOf(attempt.handle);
  if (!job_id.ok()) {
    contract::LogError("job %s attempt %d: %s; not adopted", attempt.job_id, attempt.attempt,
                       job_id.status().message());
    return adopted;
  }
  absl::StatusOr<std::string> shown = options_.runner({"scontrol", "show", "job", "--oneliner", *job_id});
  absl::StatusOr<slurm::SlurmJobStatus> status =
      shown.ok() ? slurm::ParseShowJob(*shown) : absl::StatusOr<slurm::SlurmJobStatus>(shown.status());
  if (!status.ok() || status->Ended()) {
    contract::LogError("job %s attempt %d: Slurm job %s is %s; not adopted", attempt.job_id, attempt.attempt, *job_id,
                      status.ok() ? status->state : std::string(status.status().message()));
    return adopted;
  }
  // A recorded id is a bare number: after slurmctld lost its state it may name anyone's job. Only
  // this job's, as it was submitted, is taken over (and so ever cancelled).
  if (const std::string other = NotThisJobs(*status, attempt); !other.empty()) {
    contract::LogError("job %s attempt %d: Slurm job %s is not this job's (%s); not adopted", attempt.job_id,
                      attempt.attempt, *job_id, other);
    return adopted;
  }
  Tracked tracked;
  tracked.world_size = world_size;
  tracked.on_exit = std::move(on_exit);
  tracked.on_allocation = attempt.on_allocation;
  tracked.reported.assign(world_size, false);
  for (int rank = 0; rank < world_size; ++rank) {
    adopted[rank] = attempt.maybe_running[rank];
    tracked.reported[rank] = !adopted[rank];  // nothing to report for a rank not taken over
  }
  tracked.job_dir = attempt.job_dir;
  tracked.attempt_dir_name = attempt.attempt_dir_name;
  tracked.run_as = attempt.run_as;
  Track(*job_id, std::move(tracked));
  return adopted;
}

std::string SlurmLauncher::NotThisJobs(const slurm::SlurmJobStatus& job, const RecordedAttempt& attempt) const {
  const int64_t uid = attempt.run_as.has_value() ? attempt.run_as->uid : geteuid();
  if (job.user_id != uid) return absl::StrCat("it is uid ", job.user_id, "'s, not ", uid, "'s");
  if (job.name != absl::StrCat("fitrun-", attempt.job_id)) return absl::StrCat("it is named '", job.name, "'");
  if (job.comment != options_.coordinator_tag) {
    return absl::StrCat("its comment is '", job.comment, "', not this coordinator's '", options_.coordinator_tag, "'");
  }
  return "";
}

void SlurmLauncher::ReleaseUnowned(const std::vector<std::string>& owned_handles) {
  if (options_.coordinator_tag.empty()) return;
  const std::set<std::string> owned(owned_handles.begin(), owned_handles.end());
  // Every user's jobs: those that run as their owners are submitted under the owners' ids. The tag
  // in the comment is this coordinator's own.
  absl::StatusOr<std::string> listed = options_.runner({"squeue", "--noheader", "--all", "--format=%i|%k"});
  if (!listed.ok()) {
    contract::LogWarning("listing Slurm jobs to cancel orphans: %s", listed.status().message());
    return;
  }
  for (absl::string_view line : absl::StrSplit(*listed, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> fields = absl::StrSplit(absl::StripAsciiWhitespace(line), absl::MaxSplits('|', 1));
    if (fields.size() != 2 || fields[1] != options_.coordinator_tag) continue;
    if (owned.count(HandleOf(fields[0])) > 0) continue;
    contract::LogWarning("cancelling Slurm job %s: this coordinator submitted it but no job holds it", fields[0]);
    absl::StatusOr<std::string> cancelled = options_.runner({"scancel", fields[0]});
    if (!cancelled.ok()) {
      contract::LogError("scancel %s: %s", fields[0], cancelled.status().message());
    }
  }
}

void SlurmLauncher::PollLoop() {
  absl::Duration interval = options_.min_poll_interval;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return wake_ || shutting_down_; };
      mu_.AwaitWithTimeout(absl::Condition(&woken), interval);
      if (shutting_down_) {
        // Stops asked for and not yet sent go out now: fitrund may be exiting because of them.
        bool pending = false;
        for (const auto& [id, tracked] : tracked_) pending |= tracked.stop_requested && !tracked.cancel_sent;
        if (!pending) return;
      }
      if (wake_) interval = options_.min_poll_interval;
      wake_ = false;
    }
    const bool changed = PollOnce();
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) {
        // One last round sent the stops; cancel outright rather than wait out the grace.
        for (auto& [id, tracked] : tracked_) {
          if (tracked.stop_requested && !tracked.cancel_sent) {
            tracked.cancel_sent = true;
            (void)options_.runner({"scancel", id});
          }
        }
        return;
      }
    }
    interval = changed ? options_.min_poll_interval
                       : std::min(options_.max_poll_interval, interval * 1.5);
  }
}

bool SlurmLauncher::PollOnce() {
  // What to do, decided under the lock; done (commands, callbacks) without it.
  std::vector<std::string> ids, to_signal, to_cancel;
  bool sweep = false;
  std::vector<std::string> owned;
  {
    absl::MutexLock lock(&mu_);
    sweep = std::exchange(sweep_orphans_, false);
    if (sweep) {
      for (const auto& [id, tracked] : tracked_) owned.push_back(HandleOf(id));
    }
    const absl::Time now = absl::Now();
    for (auto& [id, tracked] : tracked_) {
      ids.push_back(id);
      if (tracked.stop_requested && !tracked.stop_sent) {
        tracked.stop_sent = true;
        to_signal.push_back(id);
      }
      if (tracked.cancel_at && *tracked.cancel_at <= now && !tracked.cancel_sent) {
        tracked.cancel_sent = true;
        to_cancel.push_back(id);
      }
    }
  }
  if (sweep) ReleaseUnowned(owned);
  if (ids.empty()) return sweep;

  std::map<std::string, slurm::SlurmJobStatus> statuses;
  absl::StatusOr<std::string> listed = options_.runner(
      {"squeue", "--noheader", "--states=all", absl::StrCat("--jobs=", absl::StrJoin(ids, ",")),
       absl::StrCat("--format=", slurm::kSqueueFormat)});
  if (listed.ok()) {
    absl::StatusOr<std::vector<slurm::SlurmJobStatus>> parsed = slurm::ParseSqueue(*listed);
    if (parsed.ok()) {
      for (slurm::SlurmJobStatus& status : *parsed) statuses[status.id] = std::move(status);
    } else {
      contract::LogWarning("reading squeue: %s; retrying", parsed.status().message());
      return false;
    }
  } else if (!absl::StrContains(listed.status().message(), "Invalid job id")) {
    contract::LogWarning("squeue: %s; retrying", listed.status().message());
    return false;
  }
  for (const std::string& id : ids) {
    if (statuses.count(id) > 0) continue;
    // Gone from squeue (or squeue refused the list for one purged id): scontrol remembers a finished
    // job for MinJobAge, and a job it does not know any more is over.
    absl::StatusOr<std::string> shown = options_.runner({"scontrol", "show", "job", "--oneliner", id});
    if (shown.ok()) {
      absl::StatusOr<slurm::SlurmJobStatus> status = slurm::ParseShowJob(*shown);
      if (status.ok()) {
        statuses[id] = *status;
        continue;
      }
      contract::LogWarning("reading scontrol show job %s: %s; retrying", id, status.status().message());
    } else if (absl::StrContains(shown.status().message(), "Invalid job id")) {
      slurm::SlurmJobStatus gone;
      gone.id = id;
      gone.state = "COMPLETED";
      gone.reason = "no longer known to Slurm";
      statuses[id] = gone;
    } else {
      contract::LogWarning("scontrol show job %s: %s; retrying", id, shown.status().message());
    }
  }

  for (const std::string& id : to_signal) {
    const auto it = statuses.find(id);
    const bool pending = it != statuses.end() && it->second.Pending();
    // A pending allocation has no process to signal: cancel it outright.
    absl::StatusOr<std::string> result =
        pending ? options_.runner({"scancel", id}) : options_.runner({"scancel", "--signal=TERM", "--full", id});
    if (!result.ok()) {
      contract::LogError("stopping Slurm job %s: %s", id, result.status().message());
    }
  }
  for (const std::string& id : to_cancel) {
    const auto it = statuses.find(id);
    if (it != statuses.end() && it->second.Ended()) continue;
    absl::StatusOr<std::string> result = options_.runner({"scancel", id});
    if (!result.ok()) {
      contract::LogError("scancel %s: %s", id, result.status().message());
    }
  }

  // Reports, gathered under the lock and made without it (the job manager's callbacks take its own).
  std::vector<std::function<void()>> reports;
  bool changed = !to_signal.empty() || !to_cancel.empty();
  {
    absl::MutexLock lock(&mu_);
    for (auto it = tracked_.begin(); it != tracked_.end();) {
      const auto status = statuses.find(it->first);
      if (status == statuses.end()) {
        ++it;
        continue;
      }
      Tracked& tracked = it->second;
      const slurm::SlurmJobStatus& job = status->second;
      const std::string text = Describe(job);
      if (text != tracked.last_status) {
        tracked.last_status = text;
        changed = true;
        if (tracked.on_allocation) {
          reports.push_back([callback = tracked.on_allocation, granted = !job.Pending(), text] {
            callback(AllocationStatus{granted, text});
          });
        }
      }
      if (!job.Pending()) {
        for (int rank = 0; rank < tracked.world_size; ++rank) {
          if (tracked.reported[rank]) continue;
          std::optional<int> code =
              tracked.job_dir.empty()
                  ? std::nullopt
                  : ReadExitFile(tracked.job_dir, tracked.attempt_dir_name, tracked.run_as, rank);
          WorkerExit exit;
          if (code.has_value()) {
            exit.exit_code = *code;
          } else if (job.Ended()) {
            // The allocation ended under it: killed by scancel, a node failure or the time limit.
            exit.exit_code = -1;
            exit.signal = 9;
          } else {
            continue;
          }
          tracked.reported[rank] = true;
          changed = true;
          reports.push_back([callback = tracked.on_exit, rank, exit] { callback(rank, exit); });
        }
      }
      if (job.Ended() &&
          std::all_of(tracked.reported.begin(), tracked.reported.end(), [](bool reported) { return reported; })) {
        it = tracked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& report : reports) report();
  return changed;
}

}  // namespace fitrun::server
