// The job manager: the lock, the scheduler thread, and every API and launcher call handed to its
// room (job_manager.h lists them).
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
      launcher_(launcher),
      admission_(Admission::Options{options_.data_roots, options_.max_nodes, options_.max_nodes_reason,
                                    options_.max_rank_host_memory_bytes, options_.max_rank_processes,
                                    options_.min_account_uid}),
      launch_settings_(AttemptLaunchSettings{options_.worker_binary, options_.worker_channel_address,
                                             options_.worker_tls_ca, options_.dataset_cache_dir,
                                             options_.script_binary, options_.max_rank_host_memory_bytes}),
      table_(JobTable::Options{options_.max_open_jobs_per_owner, options_.retain_finished_jobs, options_.clock}, store,
             &hub_, metrics),
      holders_(devices),
      run_memory_(&planner_, &table_, devices, metrics, options_.memory_calibrator, options_.device_costs),
      attempts_(Attempts::Options{options_.jobs_dir, options_.stop_grace, options_.final_report_wait,
                                  options_.max_rank_host_memory_bytes, options_.clock,
                                  [this](const Job& job, int attempt) { return ExitCallbackFor(job, attempt); },
                                  [this](const std::string& job_id, int attempt) {
                                    return AllocationCallbackFor(job_id, attempt);
                                  }},
                &table_, &holders_, launcher, metrics, &run_memory_, &gate_),
      sessions_(&table_, &attempts_, &run_memory_, metrics, options_.clock,
                ReportIngest::Options{options_.max_events_per_job}),
      scheduler_(Scheduler::Options{options_.host_memory_bytes, options_.cuda_allocator_config}, &table_, &holders_,
                 &attempts_, &planner_, &gate_, launcher),
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
    manager->scheduler_thread_ = std::thread([m = manager.get()] { m->SchedulerLoop(); });
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
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
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
  absl::StatusOr<bool> probe_first = scheduler_.ProbeFirstAtSubmit(*normalized, run_as);
  if (!probe_first.ok()) return probe_first.status();

  JobEntry entry;
  entry.record.token = NewToken();
  Job& job = entry.record.job;
  job.set_owner(owner);
  job.set_request_id(request_id);
  job.set_run_as(run_as);
  *job.mutable_spec() = *std::move(normalized);
  *job.mutable_created_at() = ToProto(options_.clock());
  const std::string reason =
      *probe_first ? "submitted; its workload's memory is measured first (fitrun-worker --probe)" : "submitted";
  absl::StatusOr<JobEntry*> admitted = table_.Admit(std::move(entry), reason);
  if (!admitted.ok()) return admitted.status();
  return (*admitted)->record.job;
}

absl::StatusOr<std::pair<JobSpec, Plan>> JobManager::DryRunPlan(JobSpec spec, const std::string& run_as) {
  absl::StatusOr<JobSpec> normalized = admission_.CheckSpec(std::move(spec), run_as);
  if (!normalized.ok()) return normalized.status();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Plan> plan = scheduler_.DryRun(*normalized, run_as);
  if (!plan.ok()) return plan.status();
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
  return sessions_.Attach(hello, std::move(connection));
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
  sessions_.TakeReports(key, reports);
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

// ---------------------------------------------------------------------------------------------------
// The scheduler thread

void JobManager::SchedulerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    // Wake for new work, or in time for the earliest pending deadline.
    const absl::Time now = options_.clock();
    const absl::Time wake = std::min(attempts_.CheckHeartbeats(now), attempts_.EndReportWaits(now));
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return table_.pass_requested() || shutting_down_; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
    if (shutting_down_) return;
    // A burst of submits, reports and exits is one pass, not one pass each: every pass walks the
    // queue under the lock the API's calls wait for.
    mu_.AwaitWithDeadline(absl::Condition(&shutting_down_), last_pass_ + options_.min_pass_spacing);
    if (shutting_down_) return;
    table_.TakePassRequest();

    attempts_.EndReportWaits(options_.clock());
    SchedulingPassTimes times;
    LaunchReserved(PlacePass(times), times);
    last_pass_ = absl::Now();
    if (!forgotten_.empty()) {
      const std::vector<std::string> forgotten = std::exchange(forgotten_, {});
      mu_.Unlock();  // deleting a job's events takes a while; nothing waits for it
      DeleteJobRows(forgotten);
      mu_.Lock();
    }
  }
}

JobManager::SchedulingPassTimes JobManager::RunSchedulingPass() {
  SchedulingPassTimes times;
  std::vector<std::string> forgotten;
  {
    absl::MutexLock lock(&mu_);
    LaunchReserved(PlacePass(times), times);
    forgotten = std::exchange(forgotten_, {});
  }
  DeleteJobRows(forgotten);
  return times;
}

std::vector<PendingLaunch> JobManager::PlacePass(SchedulingPassTimes& times) {
  Scheduler::Placed placed = scheduler_.PlaceQueued();
  times.queued = placed.queued;
  times.placing = placed.deciding;
  // Here, where no caller holds an entry: forgetting erases entries (never one with an attempt).
  for (std::string& id : table_.ForgetExcess()) forgotten_.push_back(std::move(id));
  return std::move(placed.launches);
}

void JobManager::LaunchReserved(std::vector<PendingLaunch> launches, SchedulingPassTimes& times) {
  const absl::Time start = absl::Now();
  for (PendingLaunch& launch : launches) {
    mu_.Unlock();
    absl::StatusOr<LaunchedAttempt> launched =
        StartRanks(launch, JobDirectoryPath(options_.jobs_dir, launch.job_id), launch_settings_, *launcher_);
    mu_.Lock();
    if (launched.ok()) ++times.placed;
    attempts_.Commit(launch, std::move(launched), shutting_down_ && options_.stop_workers_on_shutdown);
  }
  times.launching = absl::Now() - start;
}

void JobManager::AwaitLaunched(const std::string& job_id) {
  auto launched = [this, &job_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = table_.jobs().find(job_id);
    return it == table_.jobs().end() || !it->second.active || !it->second.active->launching;
  };
  mu_.Await(absl::Condition(&launched));
}

// ---------------------------------------------------------------------------------------------------
// Views

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = table_.Find(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return entry->record.job;
}

std::vector<Job> JobManager::List(const std::vector<JobState>& states) {
  absl::MutexLock lock(&mu_);
  return table_.List(states);
}

JobManager::Page JobManager::ListPage(const std::vector<JobState>& states, int64_t after_order, int limit,
                                      const std::function<bool(const Job&)>& visible) {
  absl::MutexLock lock(&mu_);
  return table_.ListPage(states, after_order, limit, visible);
}

std::vector<fitrun::v1::Device> JobManager::Devices() {
  absl::MutexLock lock(&mu_);
  return holders_.Devices(table_);
}

std::vector<fitrun::v1::Device> JobManager::Devices(const std::function<bool(const Job&)>& visible) {
  absl::MutexLock lock(&mu_);
  return DevicesSeenBy(holders_.Devices(table_), table_, visible);
}

absl::StatusOr<std::vector<JobEvent>> JobManager::ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                             int limit) {
  from_sequence = std::max<int64_t>(1, from_sequence);
  EventHub::ReadResult recent = hub_.Read(job_id, from_sequence, limit);
  if (!recent.events.empty() || from_sequence > recent.last_sequence) return std::move(recent.events);
  // Older than the in-memory tail: the store has every event.
  return store_->ReadEvents(job_id, from_sequence, limit);
}

absl::StatusOr<JobManager::LogFile> JobManager::RankLog(const std::string& job_id, int rank, int attempt) {
  absl::MutexLock lock(&mu_);
  return FindRankLog(table_, options_.jobs_dir, job_id, rank, attempt);
}

std::vector<JobManager::RunningJob> JobManager::Running() {
  absl::MutexLock lock(&mu_);
  return RunningJobs(table_, holders_);
}

absl::StatusOr<std::vector<JobManager::RankView>> JobManager::Ranks(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = table_.Find(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return RanksOf(*entry);
}

}  // namespace fitrun::server
