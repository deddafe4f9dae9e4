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
      holders_(devices),
      run_memory_(&planner_, &table_, devices, metrics, options_.memory_calibrator, options_.device_costs),
      attempts_(Attempts::Options{options_.jobs_dir, options_.stop_grace, options_.final_report_wait,
                                  options_.max_rank_host_memory_bytes, options_.clock,
                                  [this](const Job& job, int attempt) { return ExitCallbackFor(job, attempt); },
                                  [this](const std::string& job_id, int attempt) {
                                    return AllocationCallbackFor(job_id, attempt);
                                  }},
                &table_, &holders_, launcher, metrics, &run_memory_, &gate_),
      launch_settings_(AttemptLaunchSettings{options_.worker_binary, options_.worker_channel_address,
                                             options_.worker_tls_ca, options_.dataset_cache_dir,
                                             options_.script_binary, options_.max_rank_host_memory_bytes}),
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
        if (entry.active) attempts_.StopRanks(entry, "the coordinator is shutting down");
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
        attempts_.Recover(entry);
        break;
      case fitrun::v1::JOB_STATE_RESTARTING:
      case fitrun::v1::JOB_STATE_FAILED:
      case fitrun::v1::JOB_STATE_CANCELLED:
        attempts_.StopLeftovers(entry);
        break;
      default:
        break;
    }
    table_.RestoreDone(entry);
  }
  table_.RequestPass();
  return absl::OkStatus();
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
  attempts_.RecordOutcome(entry, absl::StrCat("cancelled: ", why));
  if (absl::Status status = table_.Transition(entry, fitrun::v1::JOB_STATE_CANCELLED, why); !status.ok()) return status;
  if (entry.active) attempts_.StopRanks(entry, why);
  attempts_.MaybeRelease(entry);
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
      attempts_.MoveAtCheckpoint(entry, report->checkpoint_saved().step());
      break;
    }
    switch (ingested.next) {
      case ReportIngest::Next::kOutOfMemory: {
        // The OOM event goes out before the restart it leads to; the peers are stopped right away
        // instead of waiting in their next collective.
        const fitrun::v1::OutOfMemory oom = events.back().oom();
        (void)table_.PublishAll(entry, std::exchange(events, {}));
        attempts_.OnOutOfMemory(entry, oom);
        break;
      }
      case ReportIngest::Next::kFinished:
        // The rank_finished event goes out before whatever state change it leads to.
        (void)table_.PublishAll(entry, std::exchange(events, {}));
        attempts_.MaybeSucceed(entry, /*deadline_passed=*/false);
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
  JobEntry* entry = table_.Find(job_id);
  if (entry != nullptr) attempts_.OnAllocation(*entry, attempt, status);
}

WorkerLauncher::RankExitCallback JobManager::ExitCallbackFor(const Job& job, int attempt) {
  return [this, job_id = job.id(), attempt, job_dir = JobDirectoryPath(options_.jobs_dir, job.id()),
          run_as = job.run_as()](int rank, const WorkerExit& exit) {
    // A known clean exit has nothing to show; an adopted rank's is not known yet.
    const bool maybe_failed = !exit.status_known || exit.exit_code != 0 || exit.signal != 0;
    const std::string log_tail = maybe_failed ? RankLogTail(job_dir, run_as, attempt, rank) : "";
    OnWorkerExit(WorkerKey{job_id, attempt, rank}, exit, log_tail);
  };
}

void JobManager::OnWorkerExit(const WorkerKey& key, const WorkerExit& exit, const std::string& log_tail) {
  absl::MutexLock lock(&mu_);
  AwaitLaunched(key.job_id);
  JobEntry* entry = table_.Find(key.job_id);
  if (entry != nullptr) attempts_.OnRankExit(*entry, key, exit, log_tail);
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

}  // namespace fitrun::server
