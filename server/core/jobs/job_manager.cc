// The job manager: every job's lifecycle, from its admission to its end. This file holds the
// lifecycle itself: loading stored jobs, the API's calls, workers attaching and reporting, an attempt
// succeeding, stopping and being released, and the one place a state changes (Transition) with the
// publishing of events. How queued jobs start is in job_manager_scheduling.cc, what fails and recovers in
// job_manager_recovery.cc, what the manager shows in job_manager_views.cc.
#include "server/core/jobs/job_manager.h"

#include "server/core/jobs/first_steps.h"
#include "server/core/jobs/job_directory.h"

#include <sys/random.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/contract/log.h"
#include "server/auth/same_secret.h"
#include "server/core/jobs/proto_time.h"
#include "server/core/jobs/run_peaks.h"
#include "server/core/specs/job_specs.h"
#include "server/core/specs/workloads.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;
using fitrun::v1::JobSpec;
using fitrun::v1::JobState;
using fitrun::v1::Plan;

// 128 bits from the kernel's random source (getrandom: no file to open per token).
std::string NewToken() {
  uint32_t words[4];
  size_t got = 0;
  while (got < sizeof(words)) {
    const ssize_t n = getrandom(reinterpret_cast<char*>(words) + got, sizeof(words) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::StrFormat("%08x%08x%08x%08x", words[0], words[1], words[2], words[3]);
}

}  // namespace

JobManager::JobManager(Options options, JobStore* store, DeviceInventory* devices, WorkerLauncher* launcher,
                       CoordinatorMetrics* metrics)
    : options_(std::move(options)),
      planner_(JobPlanner::Options{options_.max_nodes, options_.max_nodes_reason, options_.max_rank_host_memory_bytes,
                                   options_.host_memory_bytes, options_.estimator, options_.memory_calibrator,
                                   options_.device_costs, options_.cuda_allocator_config}),
      store_(store),
      devices_(devices),
      launcher_(launcher),
      metrics_(metrics),
      admission_(Admission::Options{options_.data_roots, options_.max_nodes, options_.max_nodes_reason,
                                    options_.max_rank_host_memory_bytes, options_.max_rank_processes,
                                    options_.min_account_uid}),
      table_(JobTable::Options{options_.max_open_jobs_per_owner, options_.retain_finished_jobs, options_.clock}, store,
             &hub_, metrics),
      ingest_(metrics, options_.clock, ReportIngest::Options{options_.max_events_per_job}),
      run_memory_(&planner_, &table_, devices, metrics, options_.memory_calibrator, options_.device_costs),
      holders_(devices),
      gate_(options_.memory_calibrator, calibration_callbacks_.Wrap([this] {
              absl::MutexLock lock(&mu_);
              table_.RequestPass();
            })) {}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(Options options, JobStore* store,
                                                               DeviceInventory* devices, WorkerLauncher* launcher,
                                                               CoordinatorMetrics* metrics) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("JobManager: state_dir is required");
  // Workers run in their attempt's directory, so every path handed to them must be absolute.
  std::error_code error;
  options.state_dir = std::filesystem::absolute(options.state_dir, error).string();
  if (options.jobs_dir.empty()) options.jobs_dir = (std::filesystem::path(options.state_dir) / "jobs").string();
  options.jobs_dir = std::filesystem::absolute(options.jobs_dir, error).string();
  std::filesystem::create_directories(options.jobs_dir, error);
  if (error) return absl::FailedPreconditionError(absl::StrCat("cannot create ", options.jobs_dir, ": ", error.message()));
  std::unique_ptr<JobManager> manager(new JobManager(std::move(options), store, devices, launcher, metrics));
  if (absl::Status status = manager->LoadStoredJobs(); !status.ok()) return status;
  std::vector<std::string> owned_handles;
  {
    absl::MutexLock lock(&manager->mu_);
    for (const auto& [id, entry] : manager->table_.jobs()) {
      for (const fitrun::v1::AttemptRecord& attempt : entry.record.job.attempt_history()) {
        if (!attempt.launch_handle().empty()) owned_handles.push_back(attempt.launch_handle());
      }
    }
  }
  manager->launcher_->ReleaseUnowned(owned_handles);
  if (manager->options_.run_scheduler_thread) {
    manager->scheduler_ = std::thread([m = manager.get()] { m->SchedulerLoop(); });
  }
  return manager;
}

JobManager::~JobManager() { Shutdown(); }

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    // Either way the jobs stay RUNNING in the store: the next coordinator re-adopts live ranks and
    // restarts the others.
    if (options_.stop_workers_on_shutdown) {
      for (auto& [id, entry] : table_.jobs()) {
        if (entry.active) StopRanks(entry, "the coordinator is shutting down");
      }
    }
  }
  if (scheduler_.joinable()) scheduler_.join();
}

absl::Status JobManager::LoadStoredJobs() {
  absl::StatusOr<std::vector<JobRecord>> records = store_->LoadJobs();
  if (!records.ok()) return records.status();
  // Jobs stored before specs carried what was read of their files: read it now, once, as at submit
  // (as the owner, before any lock). A job whose files are gone keeps none, and its plan says so.
  for (JobRecord& record : *records) {
    JobSpec& spec = *record.job.mutable_spec();
    if (IsTerminal(record.job.state()) || spec.has_file_facts()) continue;
    absl::StatusOr<JobSpec> read = admission_.CheckSpec(spec, record.job.run_as());
    if (read.ok()) *spec.mutable_file_facts() = read->file_facts();
  }
  absl::MutexLock lock(&mu_);
  for (JobRecord& record : *records) {
    const std::string id = record.job.id();
    // The job row is not rewritten for every event; the events table says where numbering stands.
    absl::StatusOr<int64_t> last = store_->LastEventSequence(id);
    if (!last.ok()) return last.status();
    record.job.set_last_sequence(std::max(record.job.last_sequence(), *last));
    JobEntry& entry = table_.Restore(std::move(record));
    switch (entry.record.job.state()) {
      case fitrun::v1::JOB_STATE_PLANNING:
        (void)table_.Transition(entry, fitrun::v1::JOB_STATE_QUEUED, "the coordinator restarted before the job launched");
        break;
      case fitrun::v1::JOB_STATE_RUNNING:
        RecoverRunningJob(entry);
        break;
      case fitrun::v1::JOB_STATE_RESTARTING:
      case fitrun::v1::JOB_STATE_FAILED:
      case fitrun::v1::JOB_STATE_CANCELLED:
        // The previous coordinator may have died while stopping these ranks: finish the job of
        // stopping them, so the restarted attempt never runs beside the old one.
        if (AdoptLastAttempt(entry) > 0) {
          StopRanks(entry, absl::StrCat("the job is ", JobStateName(entry.record.job.state())));
        }
        MaybeReleaseAttempt(entry);
        break;
      default:
        break;
    }
    table_.RestoreDone(entry);
  }
  table_.RequestPass();
  return absl::OkStatus();
}

absl::Duration JobManager::StopGrace(const JobEntry& entry) const {
  const double seconds = entry.record.job.spec().fault_tolerance().stop_grace_seconds();
  return seconds > 0 ? absl::Seconds(seconds) : options_.stop_grace;
}

// ---------------------------------------------------------------------------------------------------
// Public API

absl::StatusOr<Job> JobManager::Submit(JobSpec spec, const std::string& owner, const std::string& request_id,
                                       const std::string& run_as) {
  if (absl::Status valid = Admission::CheckRequestId(request_id); !valid.ok()) return valid;
  absl::StatusOr<JobSpec> normalized = admission_.CheckSpec(std::move(spec), run_as);
  if (!normalized.ok()) return normalized.status();

  absl::MutexLock lock(&mu_);
  if (std::optional<std::string> earlier = table_.open_jobs().EarlierJob(owner, request_id); earlier.has_value()) {
    // A retry of a submit that got through (its answer may have been lost) gets that job back.
    const Job& job = table_.jobs().at(*earlier).record.job;
    if (absl::Status same = Admission::SameSubmit(request_id, job, *normalized); !same.ok()) return same;
    return job;
  }
  if (absl::Status room = table_.open_jobs().CheckQuota(owner); !room.ok()) return room;
  // A job that could never run on this node is refused now rather than queued forever. Its memory
  // is judged here only when its workload is measured: the analytic estimate is an upper bound, so
  // "does not fit" from it waits for the measurement, which runs off this call's path.
  const bool settled = gate_.Settled(*normalized, run_as);
  Job unplanned;
  *unplanned.mutable_spec() = *normalized;
  const bool probe_first = !settled && gate_.LaunchesWithoutProbe(unplanned, EveryDeviceAsIfIdle(), GatePlanner()).empty();
  absl::StatusOr<Plan> feasible = PlanOn(*normalized, run_as, /*only_free_devices=*/false);
  if (!feasible.ok()) {
    if (absl::IsUnavailable(feasible.status())) {
      return absl::InvalidArgumentError(absl::StrCat("spec.resources.min_devices: ", feasible.status().message(),
                                                     " on this node in all; lower min_devices"));
    }
    if (settled || !absl::IsResourceExhausted(feasible.status())) return feasible.status();
  }

  JobEntry entry;
  entry.record.token = NewToken();
  Job& job = entry.record.job;
  job.set_owner(owner);
  job.set_request_id(request_id);
  job.set_run_as(run_as);
  *job.mutable_spec() = *std::move(normalized);
  *job.mutable_created_at() = ToProto(options_.clock());
  const std::string reason =
      probe_first ? "submitted; its workload's memory is measured first (fitrun-worker --probe)" : "submitted";
  absl::StatusOr<JobEntry*> admitted = table_.Admit(std::move(entry), reason);
  if (!admitted.ok()) return admitted.status();
  return (*admitted)->record.job;
}

absl::StatusOr<std::pair<JobSpec, Plan>> JobManager::DryRunPlan(JobSpec spec, const std::string& run_as) {
  absl::StatusOr<JobSpec> normalized = admission_.CheckSpec(std::move(spec), run_as);
  if (!normalized.ok()) return normalized.status();
  absl::MutexLock lock(&mu_);
  // Never waits for a probe: an unmeasured workload is planned with the analytic estimate while
  // its measurement starts, and the plan says so.
  Job unplanned;
  *unplanned.mutable_spec() = *normalized;
  const std::string without_probe = gate_.LaunchesWithoutProbe(unplanned, EveryDeviceAsIfIdle(), GatePlanner());
  int64_t roomiest = 0;
  for (const DeviceCapacity& device : EveryDeviceAsIfIdle()) roomiest = std::max(roomiest, device.free_bytes);
  const std::string calibrating = without_probe.empty() ? gate_.AwaitCalibration(*normalized, roomiest, run_as) : "";
  absl::StatusOr<Plan> plan = PlanOn(*normalized, run_as, /*only_free_devices=*/true);
  if (absl::IsUnavailable(plan.status())) {
    // Busy devices: show the plan it gets once they free up.
    plan = PlanOn(*normalized, run_as, /*only_free_devices=*/false);
    if (plan.ok()) plan->add_reasons("queued: not enough devices are free now; this is the plan once they are");
  }
  const std::string pending = absl::StrCat(
      calibrating, ": this is the analytic estimate, an upper bound; plan again in a few seconds for a calibrated one");
  if (!plan.ok()) {
    if (!calibrating.empty()) return absl::Status(plan.status().code(), absl::StrCat(plan.status().message(), " (", pending, ")"));
    return plan.status();
  }
  if (!without_probe.empty()) {
    plan->add_reasons(without_probe);
  } else if (!calibrating.empty()) {
    plan->add_reasons(pending);
  } else if (const std::string measuring = gate_.AwaitPlanMeasurement(*normalized, *plan, run_as); !measuring.empty()) {
    plan->add_reasons(absl::StrCat("before launch: ", measuring));
  }
  return std::make_pair(*std::move(normalized), *std::move(plan));
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = table_.jobs().find(job_id);
  if (it == table_.jobs().end()) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  JobEntry& entry = it->second;
  if (IsTerminal(entry.record.job.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ended (",
                                                      JobStateName(entry.record.job.state()), ")"));
  }
  const std::string why = reason.empty() ? "cancelled by a user" : reason;
  entry.record.job.set_failure_reason(why);
  RecordAttemptOutcome(entry, absl::StrCat("cancelled: ", why));
  if (absl::Status status = table_.Transition(entry, fitrun::v1::JOB_STATE_CANCELLED, why); !status.ok()) return status;
  if (entry.active) StopRanks(entry, why);
  MaybeReleaseAttempt(entry);
  return entry.record.job;
}

// ---------------------------------------------------------------------------------------------------
// Workers

absl::StatusOr<WorkerKey> JobManager::AttachWorker(const fitrun::v1::Hello& hello,
                                                   std::weak_ptr<WorkerConnection> connection) {
  absl::MutexLock lock(&mu_);
  AwaitLaunched(hello.job_id());
  // A missing job and a wrong token get one answer, and the comparison takes as long whatever the
  // token: a caller learns neither which jobs exist nor how much of a token it guessed.
  auto it = table_.jobs().find(hello.job_id());
  const bool matches = it != table_.jobs().end() && SameSecret(hello.job_token(), it->second.record.token);
  if (!matches) return absl::PermissionDeniedError("hello: no job with this job_id and job_token");
  JobEntry& entry = it->second;
  if (!entry.active || entry.active->attempt != hello.attempt()) {
    return absl::FailedPreconditionError(absl::StrCat("hello.attempt: attempt ", hello.attempt(), " of job ",
                                                      hello.job_id(), " is not running"));
  }
  if (hello.rank() < 0 || hello.rank() >= static_cast<int>(entry.active->ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat("hello.rank: ", hello.rank(), " is out of range"));
  }
  entry.active->ranks[hello.rank()].connection = connection;
  entry.active->ranks[hello.rank()].last_heard = options_.clock();
  if (IsTerminal(entry.record.job.state())) {
    if (auto live = connection.lock()) live->SendStop("the job has ended");
  }
  return WorkerKey{hello.job_id(), hello.attempt(), hello.rank()};
}

void JobManager::OnWorkerReport(const WorkerKey& key, const fitrun::v1::WorkerReport& report) {
  std::vector<const fitrun::v1::WorkerReport*> reports;
  if (report.has_batch()) {
    for (const fitrun::v1::WorkerReport& one : report.batch().reports()) reports.push_back(&one);
  } else {
    reports.push_back(&report);
  }
  OnWorkerReports(key, reports);
}

void JobManager::OnWorkerReports(const WorkerKey& key, absl::Span<const fitrun::v1::WorkerReport* const> reports) {
  absl::MutexLock lock(&mu_);
  AwaitLaunched(key.job_id);
  auto it = table_.jobs().find(key.job_id);
  if (it == table_.jobs().end()) return;
  JobEntry& entry = it->second;
  std::vector<JobEvent> events;
  for (const fitrun::v1::WorkerReport* report : reports) {
    // Checked per report: a finished rank below may end the attempt.
    if (!entry.active || entry.active->attempt != key.attempt) break;  // a late report of an older attempt
    ReportIngest::Ingested ingested = ingest_.Ingest(entry, key.rank, *report);
    for (JobEvent& event : ingested.events) events.push_back(std::move(event));
    if ((report->has_progress() || report->has_finished()) && FirstStepsDue(entry).has_value()) {
      // What a script's first steps measured goes out after the report that completed it (once per
      // attempt; otherwise a batch's events go to the store in one transaction).
      (void)table_.PublishAll(entry, std::exchange(events, {}));
      run_memory_.AfterFirstSteps(entry);
    }
    if (report->has_checkpoint_saved() && key.rank == 0 && entry.active && entry.active->move_at_checkpoint) {
      (void)table_.PublishAll(entry, std::exchange(events, {}));
      MoveAtCheckpoint(entry, report->checkpoint_saved().step());
      break;
    }
    switch (ingested.next) {
      case ReportIngest::Next::kOutOfMemory: {
        // The OOM event goes out before the restart it leads to; the peers are stopped right away
        // instead of waiting in their next collective.
        const fitrun::v1::OutOfMemory oom = events.back().oom();
        (void)table_.PublishAll(entry, std::exchange(events, {}));
        OnOutOfMemoryLocked(entry, oom);
        break;
      }
      case ReportIngest::Next::kFinished:
        // The rank_finished event goes out before whatever state change it leads to.
        (void)table_.PublishAll(entry, std::exchange(events, {}));
        MaybeSucceed(entry, /*deadline_passed=*/false);
        break;
      case ReportIngest::Next::kNothing:
        break;
    }
  }
  (void)table_.PublishAll(entry, std::move(events));
}

AllocationCallback JobManager::AllocationCallbackFor(const std::string& job_id, int attempt) {
  return [this, job_id, attempt](const AllocationStatus& status) { OnAllocation(job_id, attempt, status); };
}

void JobManager::OnAllocation(const std::string& job_id, int attempt, const AllocationStatus& status) {
  absl::MutexLock lock(&mu_);
  AwaitLaunched(job_id);
  auto it = table_.jobs().find(job_id);
  if (it == table_.jobs().end()) return;
  JobEntry& entry = it->second;
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
  table_.Publish(entry, note);
  table_.Persist(entry);
}

void JobManager::MaybeSucceed(JobEntry& entry, bool deadline_passed) {
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
      table_.RequestPass();
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
  RecordAttemptOutcome(entry, "succeeded");
  (void)table_.Transition(entry, fitrun::v1::JOB_STATE_SUCCEEDED, reason);
}

void JobManager::StopRanks(JobEntry& entry, const std::string& reason) {
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

void JobManager::MaybeReleaseAttempt(JobEntry& entry) {
  if (!entry.active || entry.active->launching) return;
  for (const RankState& rank : entry.active->ranks) {
    if (!rank.exited) return;
  }
  const JobState state = entry.record.job.state();
  if (!IsTerminal(state) && state != fitrun::v1::JOB_STATE_RESTARTING) return;
  run_memory_.RecordAttempt(entry);
  // Whatever the ranks left behind (a script's daemon) goes with the attempt.
  if (!entry.active->launch_handle.empty()) launcher_->Release(entry.active->launch_handle);
  holders_.Release(entry.active->device_ids);
  Job& job = entry.record.job;
  if (!job.attempt_history().empty()) {
    *job.mutable_attempt_history(job.attempt_history_size() - 1)->mutable_ended_at() = ToProto(options_.clock());
  }
  entry.active.reset();
  job.clear_allocation_status();
  table_.Persist(entry);
  table_.RequestPass();
}

// ---------------------------------------------------------------------------------------------------
// State, events, devices

void JobManager::DeleteJobRows(const std::vector<std::string>& job_ids) {
  if (job_ids.empty()) return;
  // Left in the store on a failure, they are forgotten again at the next start.
  if (absl::Status status = store_->DeleteJobs(job_ids); !status.ok()) {
    contract::LogError("could not delete %zu ended job(s) beyond --retain_finished_jobs from the store: %s",
            job_ids.size(), std::string(status.message()).c_str());
  }
}

void JobManager::MoveAtCheckpoint(JobEntry& entry, int64_t checkpoint_step) {
  if (!entry.active || !entry.active->move_at_checkpoint.has_value()) return;
  Job& job = entry.record.job;
  if (job.state() != fitrun::v1::JOB_STATE_RUNNING) return;
  const fitrun::v1::Plan& to = *entry.active->move_at_checkpoint;
  const std::string reason =
      absl::StrCat("moving to per-device batch ", to.per_device_batch(), " x ", to.grad_accum_steps(),
                   " accumulation, which the first steps' memory allows, from the checkpoint of step ", checkpoint_step);
  entry.active->move_at_checkpoint.reset();
  job.set_measured_moves(job.measured_moves() + 1);
  RecordAttemptOutcome(entry, reason);
  metrics_->JobRestarted("measured_move");
  entry.recovering_since = options_.clock();
  (void)table_.Transition(entry, fitrun::v1::JOB_STATE_RESTARTING, reason);
  StopRanks(entry, reason);
}

}  // namespace fitrun::server
