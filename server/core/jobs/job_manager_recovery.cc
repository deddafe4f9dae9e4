// JobManager, part two: what happens when an attempt fails or a coordinator restarts. Out-of-memory
// errors, crashes and silent ranks decide between a restart (with a new plan after an OOM) and the
// job's end; a restarted coordinator takes over or stops the ranks its predecessor left. Same class,
// same mutex as job_manager.cc; split only so that each file reads as one concern.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/contract/launch_contract.h"
#include "server/core/jobs/attempt_launch.h"
#include "server/core/jobs/job_directory.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/proto_time.h"
#include "server/core/specs/job_specs.h"
#include "server/core/memory/memory_feedback.h"
#include "server/core/memory/planner.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;

// "rank 1 exited with code 1 (attempt 2): <its failure report>": what a rank's unclean exit says.
std::string ExitHeadline(const WorkerKey& key, const WorkerExit& exit, const std::string& failure_report) {
  std::string headline =
      !exit.status_known ? absl::StrCat("rank ", key.rank, " (adopted after a coordinator restart) exited before finishing")
      : exit.signal != 0 ? absl::StrCat("rank ", key.rank, " was killed by signal ", exit.signal)
                         : absl::StrCat("rank ", key.rank, " exited with code ", exit.exit_code);
  absl::StrAppend(&headline, " (attempt ", key.attempt, ")");
  if (!failure_report.empty()) absl::StrAppend(&headline, ": ", failure_report);
  return headline;
}

}  // namespace

void JobManager::RecordAttemptOutcome(JobEntry& entry, const std::string& outcome) {
  Job& job = entry.record.job;
  if (job.attempt_history().empty()) return;
  fitrun::v1::AttemptRecord* record = job.mutable_attempt_history(job.attempt_history_size() - 1);
  if (record->outcome().empty()) record->set_outcome(outcome);
}

WorkerLauncher::RankExitCallback JobManager::ExitCallbackFor(const Job& job, int attempt) {
  return [this, job_id = job.id(), attempt, job_dir = JobDirectoryPath(options_.jobs_dir, job.id()), run_as = job.run_as()](
             int rank, const WorkerExit& exit) {
    // A known clean exit has nothing to show; an adopted rank's is not known yet.
    const bool maybe_failed = !exit.status_known || exit.exit_code != 0 || exit.signal != 0;
    const std::string log_tail = maybe_failed ? RankLogTail(job_dir, run_as, attempt, rank) : "";
    OnWorkerExit(WorkerKey{job_id, attempt, rank}, exit, log_tail);
  };
}

void JobManager::OnWorkerExit(const WorkerKey& key, const WorkerExit& exit, const std::string& log_tail) {
  absl::MutexLock lock(&mu_);
  AwaitLaunched(key.job_id);
  auto it = table_.jobs().find(key.job_id);
  if (it == table_.jobs().end()) return;
  JobEntry& entry = it->second;
  if (!entry.active || entry.active->attempt != key.attempt) return;
  RankState& rank = entry.active->ranks[key.rank];
  if (rank.exited) return;
  rank.exited = true;
  rank.exit = exit;
  // An adopted worker's status is unknown; its final report says whether it finished.
  const bool clean = exit.status_known ? (exit.exit_code == 0 && exit.signal == 0) : rank.finished.has_value();
  if (!exit.status_known) {
    rank.exit.exit_code = clean ? 0 : -1;
    rank.exit.signal = 0;
  }
  Job& job = entry.record.job;
  if (!job.attempt_history().empty()) {
    fitrun::v1::AttemptRecord* record = job.mutable_attempt_history(job.attempt_history_size() - 1);
    if (key.rank < record->ranks_size()) {
      fitrun::v1::RankOutcome* outcome = record->mutable_ranks(key.rank);
      outcome->set_exited(true);
      outcome->set_exit_code(rank.exit.exit_code);
      outcome->set_signal(rank.exit.signal);
    }
  }

  // The OOM killer struck before this exit: said first, as it happened first.
  const std::string host_oom = OnHostMemoryOomLocked(entry, key, exit);
  JobEvent event;
  auto* exited = event.mutable_rank_exited();
  exited->set_rank(key.rank);
  exited->set_exit_code(rank.exit.exit_code);
  exited->set_signal(rank.exit.signal);
  if (!clean) exited->set_log_tail(log_tail);
  table_.Publish(entry, event);

  if (entry.record.job.state() == fitrun::v1::JOB_STATE_RUNNING) {
    if (!clean) {
      // One rank gone means its peers would wait in their next collective until a timeout: stop
      // them now, say which rank failed and why, and try again where that can help.
      std::string headline = ExitHeadline(key, exit, rank.failure_report);
      const std::string details =
          exited->log_tail().empty() ? "" : absl::StrCat("\nlast lines of its log:\n", exited->log_tail());
      FailureKind kind = FailureKind::kCrash;
      if (!host_oom.empty()) {
        kind = FailureKind::kHostOutOfMemory;
        absl::StrAppend(&headline, ": ", host_oom);
        entry.active->out_of_memory = true;
        // The batch it ran is known not to fit in the host memory it had.
        fitrun::v1::OutOfMemory oom;
        oom.set_rank(key.rank);
        oom.set_per_device_batch(entry.record.job.plan().per_device_batch());
        oom.set_host_limit_bytes(std::max<int64_t>(1, exit.host_memory_limit_bytes));
        entry.record.job.mutable_oom_history()->Add(std::move(oom));
      } else if (exit.status_known && exit.signal == 0 &&
                 exit.exit_code == fitrun::contract::launch::kExitOutOfMemory) {
        kind = FailureKind::kOutOfMemory;
        entry.active->out_of_memory = true;
        // The rank's OutOfMemory report did not arrive: the batch it ran is still known not to fit.
        fitrun::v1::OutOfMemory oom;
        oom.set_rank(key.rank);
        oom.set_per_device_batch(entry.record.job.plan().per_device_batch());
        entry.record.job.mutable_oom_history()->Add(std::move(oom));
      } else if (exit.status_known && exit.signal == 0 && exit.exit_code == fitrun::contract::launch::kExitBadConfiguration) {
        kind = FailureKind::kBadConfig;
      }
      HandleAttemptFailure(entry, kind, headline, details);
    } else {
      MaybeSucceed(entry, /*deadline_passed=*/false);
    }
  }
  MaybeReleaseAttempt(entry);
}

int JobManager::AdoptLastAttempt(JobEntry& entry) {
  Job& job = entry.record.job;
  if (job.attempt_history().empty() || entry.active) return 0;
  fitrun::v1::AttemptRecord& record = *job.mutable_attempt_history(job.attempt_history_size() - 1);
  bool any_alive = false;
  for (const fitrun::v1::RankOutcome& outcome : record.ranks()) any_alive |= !outcome.exited();
  if (!any_alive) return 0;
  entry.active.emplace();
  ActiveAttempt& active = *entry.active;
  active.attempt = record.attempt();
  std::vector<int> pids;
  for (const fitrun::v1::RankOutcome& outcome : record.ranks()) pids.push_back(outcome.pid());
  active.launch_handle = record.launch_handle().empty() ? LocalLaunchHandle(pids) : record.launch_handle();
  active.device_ids.assign(record.device_ids().begin(), record.device_ids().end());
  active.ranks.resize(record.ranks_size());
  RecordedAttempt recorded{job.id(), record.attempt(), active.launch_handle, pids, {},
                           AllocationCallbackFor(job.id(), record.attempt())};
  for (const fitrun::v1::RankOutcome& outcome : record.ranks()) recorded.maybe_running.push_back(!outcome.exited());
  recorded.job_dir = JobDirectoryPath(options_.jobs_dir, job.id());
  recorded.attempt_dir_name = AttemptDirectoryName(record.attempt());
  if (!job.run_as().empty()) {
    absl::StatusOr<UnixAccount> account = LookUpUnixAccount(job.run_as());
    if (account.ok()) recorded.run_as = *account;
  }
  const std::vector<bool> alive = launcher_->Adopt(recorded, ExitCallbackFor(job, record.attempt()));
  const absl::Time now = options_.clock();
  int adopted = 0;
  for (fitrun::v1::RankOutcome& outcome : *record.mutable_ranks()) {
    RankState& rank = active.ranks[outcome.rank()];
    rank.pid = outcome.pid();
    rank.exited = true;  // until adopted
    if (outcome.exited()) continue;
    if (outcome.rank() >= static_cast<int>(alive.size()) || !alive[outcome.rank()]) {
      // Gone while no coordinator watched: it exited, with a status nobody saw.
      outcome.set_exited(true);
      outcome.set_exit_code(-1);
      continue;
    }
    rank.exited = false;
    rank.last_heard = now;
    ++adopted;
  }
  holders_.Hold(job.id(), active.device_ids);
  return adopted;
}

void JobManager::RecoverRunningJob(JobEntry& entry) {
  Job& job = entry.record.job;
  if (job.attempt_history().empty()) {
    (void)table_.Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, "the coordinator restarted; no attempt was on record");
    return;
  }
  const fitrun::v1::AttemptRecord& record = job.attempt_history(job.attempt_history_size() - 1);
  const int adopted = AdoptLastAttempt(entry);
  if (adopted == record.ranks_size()) {
    JobEvent event;
    event.mutable_log()->set_rank(-1);
    event.mutable_log()->set_text(absl::StrCat("the coordinator restarted and re-adopted all ", adopted,
                                               " ranks of attempt ", record.attempt()));
    table_.Publish(entry, std::move(event));
    return;
  }
  const std::string reason = absl::StrCat("the coordinator restarted and ", record.ranks_size() - adopted, " of ",
                                          record.ranks_size(), " ranks were gone; restarting from the last checkpoint");
  RecordAttemptOutcome(entry, reason);
  metrics_->JobRestarted("coordinator_restart");
  entry.recovering_since = options_.clock();
  (void)table_.Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, reason);
  StopRanks(entry, reason);
  MaybeReleaseAttempt(entry);
}

void JobManager::OnOutOfMemoryLocked(JobEntry& entry, const fitrun::v1::OutOfMemory& oom) {
  Job& job = entry.record.job;
  fitrun::v1::OutOfMemory& recorded = *job.add_oom_history();
  recorded = oom;
  if (job.plan().zero_stage() == 1) recorded.set_optimizer_state_shards(job.plan().device_ids_size());
  recorded.set_activation_checkpointing(job.plan().activation_checkpointing());
  metrics_->OutOfMemory();
  std::string headline = absl::StrCat("rank ", oom.rank(), " ran out of memory ",
                                      oom.step() > 0 ? absl::StrCat("at step ", oom.step())
                                                     : std::string("before its first reported step"),
                                      " with per-device batch ", oom.per_device_batch());
  if (oom.cap_bytes() > 0) {
    absl::StrAppend(&headline, " (needed at least ", FormatBytes(MemoryNeededAt(oom)), ", the device has ",
                    FormatBytes(oom.cap_bytes()), ")");
  }
  absl::StrAppend(&headline, " (attempt ", entry.active ? entry.active->attempt : job.attempts(), ")");
  HandleAttemptFailure(entry, FailureKind::kOutOfMemory, headline);
}

void JobManager::HandleAttemptFailure(JobEntry& entry, FailureKind kind, const std::string& headline,
                                      const std::string& details) {
  Job& job = entry.record.job;
  if (job.state() != fitrun::v1::JOB_STATE_RUNNING) return;  // already stopping for an earlier failure
  FailureFacts facts;
  facts.runs_on_gpus = RunsOnGpus(entry);
  if (kind == FailureKind::kHostOutOfMemory) facts.raise_host_memory_advice = RaiseHostMemoryAdvice(entry);
  facts.measuring_may_find_a_plan = [&] { return gate_.MeasuringMayFindAPlan(job.spec(), job.run_as()); };
  const auto [retry, decision] = DecideAfterFailure(job, kind, facts);
  RecordAttemptOutcome(entry, headline);
  const std::string reason = absl::StrCat(headline, "; ", decision);
  if (retry) {
    metrics_->JobRestarted(FailureKindLabel(kind));
    entry.recovering_since = options_.clock();
    (void)table_.Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, reason);
  } else {
    job.set_failure_reason(absl::StrCat(reason, details));
    (void)table_.Transition(entry, fitrun::v1::JOB_STATE_FAILED, job.failure_reason());
  }
  StopRanks(entry, headline);
}

std::string JobManager::OnHostMemoryOomLocked(JobEntry& entry, const WorkerKey& key, const WorkerExit& exit) {
  if (!exit.host_memory_oom) return "";
  JobEvent event;
  fitrun::v1::HostMemoryOom* oom = event.mutable_host_memory_oom();
  oom->set_rank(key.rank);
  oom->set_attempt(key.attempt);
  oom->set_limit_bytes(exit.host_memory_limit_bytes);
  oom->set_peak_bytes(exit.host_memory_peak_bytes);
  oom->set_per_device_batch(entry.record.job.plan().per_device_batch());
  table_.Publish(entry, std::move(event));
  std::string words = "the attempt's processes reached their host memory limit";
  if (exit.host_memory_limit_bytes > 0) absl::StrAppend(&words, " of ", FormatBytes(exit.host_memory_limit_bytes));
  if (exit.host_memory_peak_bytes > 0) absl::StrAppend(&words, " (peak ", FormatBytes(exit.host_memory_peak_bytes), ")");
  absl::StrAppend(&words, " and the kernel's OOM killer stopped one");
  return words;
}

std::string JobManager::RaiseHostMemoryAdvice(const JobEntry& entry) {
  const fitrun::v1::JobSpec& spec = entry.record.job.spec();
  int64_t per_rank = 0;
  if (entry.active) {
    for (const fitrun::v1::Device& device : devices_->Snapshot()) {
      if (!entry.active->device_ids.empty() && device.id() == entry.active->device_ids.front()) {
        per_rank = HostMemoryPerRank(spec, DefaultRankHostMemory(device), options_.max_rank_host_memory_bytes);
      }
    }
  }
  std::string advice = "raise spec.resources.host_memory";
  if (per_rank > 0) {
    absl::StrAppend(&advice, " (each rank may use ", FormatBytes(per_rank), " now",
                    spec.resources().host_memory().empty() ? ", the default" : "", ")");
  }
  return advice;
}

bool JobManager::RunsOnGpus(const JobEntry& entry) {
  if (!entry.active || entry.active->device_ids.empty()) return false;
  for (const fitrun::v1::Device& device : devices_->Snapshot()) {
    if (device.id() == entry.active->device_ids.front()) return device.kind() == fitrun::v1::DEVICE_KIND_CUDA;
  }
  return false;
}

absl::Time JobManager::CheckHeartbeats(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  for (auto& [id, entry] : table_.jobs()) {
    if (!entry.active || entry.record.job.state() != fitrun::v1::JOB_STATE_RUNNING) continue;
    if (entry.active->allocation_pending) continue;
    const int timeout_seconds = entry.record.job.spec().fault_tolerance().heartbeat_timeout_seconds();
    if (timeout_seconds <= 0) continue;
    const absl::Duration timeout = absl::Seconds(timeout_seconds);
    for (size_t r = 0; r < entry.active->ranks.size(); ++r) {
      const RankState& rank = entry.active->ranks[r];
      if (rank.exited || rank.last_heard == absl::InfinitePast()) continue;
      if (now - rank.last_heard >= timeout) {
        HandleAttemptFailure(
            entry, FailureKind::kHang,
            absl::StrFormat("rank %d sent nothing for %.1f s (spec.fault_tolerance.heartbeat_timeout_seconds %d): "
                            "it is stopped or hung (attempt %d)",
                            r, absl::ToDoubleSeconds(now - rank.last_heard), timeout_seconds, entry.active->attempt));
        break;
      }
      next = std::min(next, rank.last_heard + timeout);
    }
  }
  return next;
}

}  // namespace fitrun::server
