#include "server/core/jobs/attempts.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/contract/launch_contract.h"
#include "server/core/jobs/job_directory.h"
#include "server/core/jobs/proto_time.h"
#include "server/core/memory/memory_feedback.h"
#include "server/core/specs/job_specs.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;
using fitrun::v1::JobState;
using fitrun::v1::Plan;

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

PendingLaunch Attempts::Reserve(JobEntry& entry, const Placement& placement) {
  const Plan& plan = *placement.plan;
  Job& job = entry.record.job;
  PendingLaunch launch;
  // A first attempt's wait counts from the submit; a later one's from its previous attempt's end is
  // the recovery's business, not the launch's.
  if (job.attempts() == 0 && job.has_created_at()) {
    const absl::Duration waited = options_.clock() - FromProto(job.created_at()) - placement.planning;
    if (waited > absl::ZeroDuration()) launch.phases.push_back({"queue", waited});
  }
  launch.phases.push_back({"plan", placement.planning});
  const int attempt_number = job.attempts() + 1;
  job.set_attempts(attempt_number);
  *job.mutable_plan() = plan;

  JobEvent chosen;
  *chosen.mutable_plan_chosen()->mutable_plan() = plan;
  chosen.mutable_plan_chosen()->set_attempt(attempt_number);
  table_->Publish(entry, chosen);

  // The devices are the attempt's from here on: the next placement sees them held.
  const int world_size = plan.device_ids_size();
  entry.active.emplace();
  ActiveAttempt& active = *entry.active;
  active.attempt = attempt_number;
  active.launching = true;
  active.device_ids.assign(plan.device_ids().begin(), plan.device_ids().end());
  active.ranks.resize(world_size);
  holders_->Hold(job.id(), active.device_ids);
  if (!job.has_started_at()) *job.mutable_started_at() = ToProto(options_.clock());
  // On record from the reservation, so a cancel while the ranks start ends this attempt's record.
  fitrun::v1::AttemptRecord* record = job.add_attempt_history();
  record->set_attempt(attempt_number);
  for (const std::string& id : active.device_ids) record->add_device_ids(id);
  record->set_per_device_batch(plan.per_device_batch());
  record->set_grad_accum_steps(plan.grad_accum_steps());
  record->set_predicted_peak_bytes(plan.predicted().total_bytes());
  *record->mutable_started_at() = ToProto(options_.clock());
  for (int rank = 0; rank < world_size; ++rank) record->add_ranks()->set_rank(rank);

  launch.job_id = job.id();
  launch.attempt = attempt_number;
  launch.job = job;
  launch.token = entry.record.token;
  launch.devices = holders_->Inventory();
  launch.on_exit = options_.exit_callback(job, attempt_number);
  launch.on_allocation = options_.allocation_callback(job.id(), attempt_number);
  return launch;
}

void Attempts::Commit(PendingLaunch& launch, absl::StatusOr<LaunchedAttempt> launched, bool stop_now) {
  // The job is still here: retention never forgets a job with an attempt.
  JobEntry& entry = table_->jobs().at(launch.job_id);
  ActiveAttempt& active = *entry.active;
  Job& job = entry.record.job;
  active.launching = false;
  fitrun::v1::AttemptRecord& record = *job.mutable_attempt_history(job.attempt_history_size() - 1);
  if (!launched.ok()) {
    const std::string reason = absl::StrCat("launch failed: ", launched.status().message());
    RecordOutcome(entry, reason);
    // The launcher left none of them running.
    for (RankState& rank : active.ranks) rank.exited = true;
    if (!JobTable::IsTerminal(job.state())) {
      job.set_failure_reason(reason);
      (void)table_->Transition(entry, fitrun::v1::JOB_STATE_FAILED, reason);
    }
    MaybeRelease(entry);
    return;
  }
  active.launch_handle = launched->handle;
  record.set_launch_handle(launched->handle);
  for (size_t rank = 0; rank < active.ranks.size(); ++rank) {
    active.ranks[rank].pid = rank < launched->pids.size() ? launched->pids[rank] : 0;
    active.ranks[rank].last_heard = options_.clock();
    record.mutable_ranks(static_cast<int>(rank))->set_pid(active.ranks[rank].pid);
  }
  if (JobTable::IsTerminal(job.state())) {
    // Cancelled while its ranks were starting: they stop now.
    StopRanks(entry, job.failure_reason());
    return;
  }
  (void)table_->Transition(entry, fitrun::v1::JOB_STATE_RUNNING,
                   absl::StrCat("launched ", active.ranks.size(), " rank(s)",
                                launched->warm_ranks > 0 ? absl::StrCat(" (", launched->warm_ranks, " warm)") : "",
                                " on ", absl::StrJoin(active.device_ids, ", "), "; ", FormatLaunchPhases(launch.phases)));
  // Shutdown stopped every committed attempt's ranks while this one's were starting.
  if (stop_now) StopRanks(entry, "the coordinator is shutting down");
}

void Attempts::OnRankExit(JobEntry& entry, const WorkerKey& key, const WorkerExit& exit, const std::string& log_tail) {
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
  const std::string host_oom = OnHostMemoryOom(entry, key, exit);
  JobEvent event;
  auto* exited = event.mutable_rank_exited();
  exited->set_rank(key.rank);
  exited->set_exit_code(rank.exit.exit_code);
  exited->set_signal(rank.exit.signal);
  if (!clean) exited->set_log_tail(log_tail);
  table_->Publish(entry, event);

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
      HandleFailure(entry, kind, headline, details);
    } else {
      MaybeSucceed(entry, /*deadline_passed=*/false);
    }
  }
  MaybeRelease(entry);
}

void Attempts::OnAllocation(JobEntry& entry, int attempt, const AllocationStatus& status) {
  if (!entry.active || entry.active->attempt != attempt) return;
  const bool was_pending = entry.active->allocation_pending;
  entry.active->allocation_pending = !status.granted;
  if (was_pending && status.granted) {
    // The ranks' silence is measured from when they got their nodes.
    for (RankState& rank : entry.active->ranks) rank.last_heard = options_.clock();
  }
  Job& job = entry.record.job;
  const std::string text = status.granted ? "" : status.text;
  if (job.allocation_status() == text) return;
  job.set_allocation_status(text);
  JobEvent note;
  note.mutable_log()->set_rank(-1);
  note.mutable_log()->set_text(status.granted ? absl::StrCat("allocation: ", status.text)
                                              : absl::StrCat("waiting for the cluster's scheduler: ", status.text));
  table_->Publish(entry, note);
  table_->Persist(entry);
}

void Attempts::OnOutOfMemory(JobEntry& entry, const fitrun::v1::OutOfMemory& oom) {
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
  HandleFailure(entry, FailureKind::kOutOfMemory, headline);
}

void Attempts::MaybeSucceed(JobEntry& entry, bool deadline_passed) {
  if (!entry.active || entry.record.job.state() != fitrun::v1::JOB_STATE_RUNNING) return;
  ActiveAttempt& attempt = *entry.active;
  bool all_exited = true;
  bool all_reported = true;
  for (const RankState& rank : attempt.ranks) {
    if (!rank.exited || rank.exit.exit_code != 0 || rank.exit.signal != 0) all_exited = false;
    if (!rank.finished) all_reported = false;
  }
  if (!all_exited) return;
  if (!all_reported && !deadline_passed) {
    // Processes can exit before their last report crosses the stream; give it a moment.
    if (!attempt.awaiting_reports_until) {
      attempt.awaiting_reports_until = options_.clock() + options_.final_report_wait;
      table_->RequestPass();
    }
    return;
  }
  Job& job = entry.record.job;
  auto* result = job.mutable_result();
  for (const RankState& rank : attempt.ranks) {
    if (!rank.finished) continue;
    if (rank.finished->has_test_accuracy()) {
      result->set_has_test_accuracy(true);
      result->set_test_accuracy(rank.finished->test_accuracy());
    }
    if (rank.finished->rank() == 0) {
      result->set_final_loss(rank.finished->final_loss());
      result->set_steps(rank.finished->steps());
      result->set_train_seconds(rank.finished->train_seconds());
      *result->mutable_metrics() = rank.finished->metrics();
    }
  }
  std::string reason = "every rank finished";
  if (!all_reported) reason = "every rank exited 0 (some final reports never arrived)";
  RecordOutcome(entry, "succeeded");
  (void)table_->Transition(entry, fitrun::v1::JOB_STATE_SUCCEEDED, reason);
}

void Attempts::MoveAtCheckpoint(JobEntry& entry, int64_t checkpoint_step) {
  if (!entry.active || !entry.active->move_at_checkpoint.has_value()) return;
  Job& job = entry.record.job;
  if (job.state() != fitrun::v1::JOB_STATE_RUNNING) return;
  const fitrun::v1::Plan& to = *entry.active->move_at_checkpoint;
  const std::string reason =
      absl::StrCat("moving to per-device batch ", to.per_device_batch(), " x ", to.grad_accum_steps(),
                   " accumulation, which the first steps' memory allows, from the checkpoint of step ", checkpoint_step);
  entry.active->move_at_checkpoint.reset();
  job.set_measured_moves(job.measured_moves() + 1);
  RecordOutcome(entry, reason);
  metrics_->JobRestarted("measured_move");
  entry.recovering_since = options_.clock();
  (void)table_->Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, reason);
  StopRanks(entry, reason);
}

absl::Time Attempts::CheckHeartbeats(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  for (auto& [id, entry] : table_->jobs()) {
    if (!entry.active || entry.record.job.state() != fitrun::v1::JOB_STATE_RUNNING) continue;
    if (entry.active->allocation_pending) continue;
    const int timeout_seconds = entry.record.job.spec().fault_tolerance().heartbeat_timeout_seconds();
    if (timeout_seconds <= 0) continue;
    const absl::Duration timeout = absl::Seconds(timeout_seconds);
    for (size_t r = 0; r < entry.active->ranks.size(); ++r) {
      const RankState& rank = entry.active->ranks[r];
      if (rank.exited || rank.last_heard == absl::InfinitePast()) continue;
      if (now - rank.last_heard >= timeout) {
        HandleFailure(
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

absl::Time Attempts::EndReportWaits(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  for (auto& [id, entry] : table_->jobs()) {
    if (!entry.active || !entry.active->awaiting_reports_until) continue;
    if (*entry.active->awaiting_reports_until > now) {
      next = std::min(next, *entry.active->awaiting_reports_until);
      continue;
    }
    entry.active->awaiting_reports_until.reset();
    MaybeSucceed(entry, /*deadline_passed=*/true);
    MaybeRelease(entry);
  }
  return next;
}

void Attempts::RecordOutcome(JobEntry& entry, const std::string& outcome) {
  Job& job = entry.record.job;
  if (job.attempt_history().empty()) return;
  fitrun::v1::AttemptRecord* record = job.mutable_attempt_history(job.attempt_history_size() - 1);
  if (record->outcome().empty()) record->set_outcome(outcome);
}

void Attempts::StopRanks(JobEntry& entry, const std::string& reason) {
  // An attempt still launching has no handle yet; its commit stops it if its job ended meanwhile.
  if (!entry.active || entry.active->launching) return;
  for (size_t r = 0; r < entry.active->ranks.size(); ++r) {
    RankState& rank = entry.active->ranks[r];
    if (rank.exited) continue;
    if (rank.exiting_on_its_own) {
      launcher_->KillIfStillRunningAfter(entry.active->launch_handle, static_cast<int>(r), StopGrace(entry));
      continue;
    }
    if (auto connection = rank.connection.lock()) connection->SendStop(reason);
    launcher_->Stop(entry.active->launch_handle, static_cast<int>(r), StopGrace(entry));
  }
}

void Attempts::MaybeRelease(JobEntry& entry) {
  if (!entry.active || entry.active->launching) return;
  for (const RankState& rank : entry.active->ranks) {
    if (!rank.exited) return;
  }
  const JobState state = entry.record.job.state();
  if (!JobTable::IsTerminal(state) && state != fitrun::v1::JOB_STATE_RESTARTING) return;
  run_memory_->RecordAttempt(entry);
  // Whatever the ranks left behind (a script's daemon) goes with the attempt.
  if (!entry.active->launch_handle.empty()) launcher_->Release(entry.active->launch_handle);
  holders_->Release(entry.active->device_ids);
  Job& job = entry.record.job;
  if (!job.attempt_history().empty()) {
    *job.mutable_attempt_history(job.attempt_history_size() - 1)->mutable_ended_at() = ToProto(options_.clock());
  }
  entry.active.reset();
  job.clear_allocation_status();
  table_->Persist(entry);
  table_->RequestPass();
}

void Attempts::Recover(JobEntry& entry) {
  Job& job = entry.record.job;
  if (job.attempt_history().empty()) {
    (void)table_->Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, "the coordinator restarted; no attempt was on record");
    return;
  }
  const fitrun::v1::AttemptRecord& record = job.attempt_history(job.attempt_history_size() - 1);
  const int adopted = AdoptLast(entry);
  if (adopted == record.ranks_size()) {
    JobEvent event;
    event.mutable_log()->set_rank(-1);
    event.mutable_log()->set_text(absl::StrCat("the coordinator restarted and re-adopted all ", adopted,
                                               " ranks of attempt ", record.attempt()));
    table_->Publish(entry, std::move(event));
    return;
  }
  const std::string reason = absl::StrCat("the coordinator restarted and ", record.ranks_size() - adopted, " of ",
                                          record.ranks_size(), " ranks were gone; restarting from the last checkpoint");
  RecordOutcome(entry, reason);
  metrics_->JobRestarted("coordinator_restart");
  entry.recovering_since = options_.clock();
  (void)table_->Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, reason);
  StopRanks(entry, reason);
  MaybeRelease(entry);
}

void Attempts::StopLeftovers(JobEntry& entry) {
  if (AdoptLast(entry) > 0) StopRanks(entry, absl::StrCat("the job is ", JobStateName(entry.record.job.state())));
  MaybeRelease(entry);
}

int Attempts::AdoptLast(JobEntry& entry) {
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
                           options_.allocation_callback(job.id(), record.attempt())};
  for (const fitrun::v1::RankOutcome& outcome : record.ranks()) recorded.maybe_running.push_back(!outcome.exited());
  recorded.job_dir = JobDirectoryPath(options_.jobs_dir, job.id());
  recorded.attempt_dir_name = AttemptDirectoryName(record.attempt());
  if (!job.run_as().empty()) {
    absl::StatusOr<UnixAccount> account = LookUpUnixAccount(job.run_as());
    if (account.ok()) recorded.run_as = *account;
  }
  const std::vector<bool> alive = launcher_->Adopt(recorded, options_.exit_callback(job, record.attempt()));
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
  holders_->Hold(job.id(), active.device_ids);
  return adopted;
}

void Attempts::HandleFailure(JobEntry& entry, FailureKind kind, const std::string& headline,
                                      const std::string& details) {
  Job& job = entry.record.job;
  if (job.state() != fitrun::v1::JOB_STATE_RUNNING) return;  // already stopping for an earlier failure
  FailureFacts facts;
  facts.runs_on_gpus = RunsOnGpus(entry);
  if (kind == FailureKind::kHostOutOfMemory) facts.raise_host_memory_advice = RaiseHostMemoryAdvice(entry);
  facts.measuring_may_find_a_plan = [&] { return gate_->MeasuringMayFindAPlan(job.spec(), job.run_as()); };
  const auto [retry, decision] = DecideAfterFailure(job, kind, facts);
  RecordOutcome(entry, headline);
  const std::string reason = absl::StrCat(headline, "; ", decision);
  if (retry) {
    metrics_->JobRestarted(FailureKindLabel(kind));
    entry.recovering_since = options_.clock();
    (void)table_->Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, reason);
  } else {
    job.set_failure_reason(absl::StrCat(reason, details));
    (void)table_->Transition(entry, fitrun::v1::JOB_STATE_FAILED, job.failure_reason());
  }
  StopRanks(entry, headline);
}

std::string Attempts::OnHostMemoryOom(JobEntry& entry, const WorkerKey& key, const WorkerExit& exit) {
  if (!exit.host_memory_oom) return "";
  JobEvent event;
  fitrun::v1::HostMemoryOom* oom = event.mutable_host_memory_oom();
  oom->set_rank(key.rank);
  oom->set_attempt(key.attempt);
  oom->set_limit_bytes(exit.host_memory_limit_bytes);
  oom->set_peak_bytes(exit.host_memory_peak_bytes);
  oom->set_per_device_batch(entry.record.job.plan().per_device_batch());
  table_->Publish(entry, std::move(event));
  std::string words = "the attempt's processes reached their host memory limit";
  if (exit.host_memory_limit_bytes > 0) absl::StrAppend(&words, " of ", FormatBytes(exit.host_memory_limit_bytes));
  if (exit.host_memory_peak_bytes > 0) absl::StrAppend(&words, " (peak ", FormatBytes(exit.host_memory_peak_bytes), ")");
  absl::StrAppend(&words, " and the kernel's OOM killer stopped one");
  return words;
}

std::string Attempts::RaiseHostMemoryAdvice(const JobEntry& entry) {
  const fitrun::v1::JobSpec& spec = entry.record.job.spec();
  int64_t per_rank = 0;
  if (entry.active) {
    for (const fitrun::v1::Device& device : holders_->Inventory()) {
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

bool Attempts::RunsOnGpus(const JobEntry& entry) {
  if (!entry.active || entry.active->device_ids.empty()) return false;
  for (const fitrun::v1::Device& device : holders_->Inventory()) {
    if (device.id() == entry.active->device_ids.front()) return device.kind() == fitrun::v1::DEVICE_KIND_CUDA;
  }
  return false;
}

absl::Duration Attempts::StopGrace(const JobEntry& entry) const {
  const double seconds = entry.record.job.spec().fault_tolerance().stop_grace_seconds();
  return seconds > 0 ? absl::Seconds(seconds) : options_.stop_grace;
}

}  // namespace fitrun::server
