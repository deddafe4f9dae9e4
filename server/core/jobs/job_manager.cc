#include "server/core/jobs/job_manager.h"
#include "server/core/spec/workloads.h"
#include "server/core/errors.h"

#include <google/protobuf/text_format.h>
#include <sys/random.h>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/contract/launch_contract.h"
#include "server/core/jobs/attempt_launch.h"
#include "server/core/jobs/job_queue.h"
#include "server/core/spec/job_spec.h"
#include "server/core/memory/memory_feedback.h"
#include "server/core/memory/model_profile.h"
#include "server/core/memory/planner.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

using fitrun::v1::Job;
using fitrun::v1::JobEvent;
using fitrun::v1::JobSpec;
using fitrun::v1::JobState;
using fitrun::v1::Plan;
namespace launch = fitrun::contract::launch;

// A plan whose predicted peak is over half its usable memory: one an estimate off by 2x could break.
bool IsTight(const Plan& plan) { return plan.predicted().total_bytes() > plan.usable_bytes() / 2; }

google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixNanos(google::protobuf::util::TimeUtil::TimestampToNanoseconds(t));
}

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

// The last lines of a rank's log, for failure reasons: what a user needs to see first.
std::string LogTail(const std::string& path, size_t max_lines = 12, size_t max_bytes = 2048) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - static_cast<std::streamoff>(max_bytes));
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (start > 0 && !lines.empty()) lines.erase(lines.begin());  // first line is cut
  if (lines.size() > max_lines) lines.erase(lines.begin(), lines.end() - static_cast<long>(max_lines));
  return absl::StrJoin(lines, "\n");
}


bool TransitionAllowed(JobState from, JobState to) {
  switch (from) {
    case fitrun::v1::JOB_STATE_UNSPECIFIED:
      return to == fitrun::v1::JOB_STATE_QUEUED;
    case fitrun::v1::JOB_STATE_QUEUED:
      return to == fitrun::v1::JOB_STATE_PLANNING || to == fitrun::v1::JOB_STATE_CANCELLED ||
             to == fitrun::v1::JOB_STATE_FAILED;
    case fitrun::v1::JOB_STATE_PLANNING:
      return to == fitrun::v1::JOB_STATE_RUNNING || to == fitrun::v1::JOB_STATE_QUEUED ||
             to == fitrun::v1::JOB_STATE_FAILED || to == fitrun::v1::JOB_STATE_CANCELLED;
    case fitrun::v1::JOB_STATE_RUNNING:
      return to == fitrun::v1::JOB_STATE_SUCCEEDED || to == fitrun::v1::JOB_STATE_FAILED ||
             to == fitrun::v1::JOB_STATE_CANCELLED || to == fitrun::v1::JOB_STATE_RESTARTING;
    case fitrun::v1::JOB_STATE_RESTARTING:
      return to == fitrun::v1::JOB_STATE_PLANNING || to == fitrun::v1::JOB_STATE_FAILED ||
             to == fitrun::v1::JOB_STATE_CANCELLED;
    default:
      return false;
  }
}

}  // namespace

bool JobManager::IsTerminal(JobState state) {
  return state == fitrun::v1::JOB_STATE_SUCCEEDED || state == fitrun::v1::JOB_STATE_FAILED ||
         state == fitrun::v1::JOB_STATE_CANCELLED;
}

JobManager::JobManager(Options options, JobStore* store, DeviceInventory* devices, WorkerLauncher* launcher,
                       CoordinatorMetrics* metrics)
    : options_(std::move(options)), store_(store), devices_(devices), launcher_(launcher), metrics_(metrics) {}

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
    for (const auto& [id, entry] : manager->jobs_) {
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
      for (auto& [id, entry] : jobs_) {
        if (entry.active) StopRanks(entry, "the coordinator is shutting down");
      }
    }
  }
  if (scheduler_.joinable()) scheduler_.join();
}

absl::Status JobManager::LoadStoredJobs() {
  absl::StatusOr<std::vector<JobRecord>> records = store_->LoadJobs();
  if (!records.ok()) return records.status();
  absl::MutexLock lock(&mu_);
  for (JobRecord& record : *records) {
    const std::string id = record.job.id();
    next_submit_order_ = std::max(next_submit_order_, record.submit_order + 1);
    // The job row is not rewritten for every event; the events table says where numbering stands.
    absl::StatusOr<int64_t> last = store_->LastEventSequence(id);
    if (!last.ok()) return last.status();
    record.job.set_last_sequence(std::max(record.job.last_sequence(), *last));
    hub_.RestoreSequence(id, record.job.last_sequence());
    JobEntry& entry = jobs_[id];
    entry.record = std::move(record);
    ids_by_order_[entry.record.submit_order] = id;
    if (!IsTerminal(entry.record.job.state())) ++open_jobs_by_owner_[entry.record.job.owner()];
    if (!entry.record.job.request_id().empty()) {
      ids_by_request_[{entry.record.job.owner(), entry.record.job.request_id()}] = id;
    }
    metrics_->JobStateChanged(fitrun::v1::JOB_STATE_UNSPECIFIED, entry.record.job.state());
    switch (entry.record.job.state()) {
      case fitrun::v1::JOB_STATE_PLANNING:
        (void)Transition(entry, fitrun::v1::JOB_STATE_QUEUED, "the coordinator restarted before the job launched");
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
  }
  RequestSchedule();
  return absl::OkStatus();
}

void JobManager::RecordAttemptOutcome(JobEntry& entry, const std::string& outcome) {
  Job& job = entry.record.job;
  if (job.attempt_history().empty()) return;
  fitrun::v1::AttemptRecord* record = job.mutable_attempt_history(job.attempt_history_size() - 1);
  if (record->outcome().empty()) record->set_outcome(outcome);
}

absl::Duration JobManager::StopGrace(const JobEntry& entry) const {
  const double seconds = entry.record.job.spec().fault_tolerance().stop_grace_seconds();
  return seconds > 0 ? absl::Seconds(seconds) : options_.stop_grace;
}

// ---------------------------------------------------------------------------------------------------
// Public API

absl::StatusOr<Job> JobManager::Submit(JobSpec spec, const std::string& owner, const std::string& request_id) {
  if (request_id.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: at most 128 characters (got ", request_id.size(), ")"));
  }
  // Before anything the spec names is opened (validation reads headers and sizes).
  if (options_.data_roots.has_value()) {
    if (absl::Status allowed = options_.data_roots->Check(spec); !allowed.ok()) return allowed;
  }
  absl::StatusOr<JobSpec> normalized = NormalizeJobSpec(std::move(spec));
  if (!normalized.ok()) return normalized.status();
  if (options_.max_nodes > 0 && normalized->resources().min_nodes() > options_.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("spec.resources.min_nodes: ", normalized->resources().min_nodes(),
                                                   " nodes, but ", options_.max_nodes_reason));
  }

  absl::MutexLock lock(&mu_);
  if (!request_id.empty()) {
    // A retry of a submit that got through (its answer may have been lost) gets that job back.
    if (auto it = ids_by_request_.find({owner, request_id}); it != ids_by_request_.end()) {
      const Job& earlier = jobs_.at(it->second).record.job;
      if (!google::protobuf::util::MessageDifferencer::Equals(earlier.spec(), *normalized)) {
        return absl::InvalidArgumentError(absl::StrCat("request_id: '", request_id, "' already created job ",
                                                       earlier.id(), " with a different spec; use a new request_id"));
      }
      return earlier;
    }
  }
  if (options_.max_open_jobs_per_owner > 0) {
    auto open = open_jobs_by_owner_.find(owner);
    if (open != open_jobs_by_owner_.end() && open->second >= options_.max_open_jobs_per_owner) {
      return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                            "jobs: ", owner.empty() ? "this user" : owner, " has ", open->second,
                            " jobs queued or running, the limit (--max_jobs_per_user); wait for some to end or "
                            "cancel them")),
                        "JOBS_PER_USER_LIMIT");
    }
  }
  // A job that could never run on this node is refused now rather than queued forever. Its memory
  // is judged here only when its workload is measured: the analytic estimate is an upper bound, so
  // "does not fit" from it waits for the measurement, which runs off this call's path.
  // (A workload being measured is not measured yet; one whose probe failed has its analytic verdict.)
  bool calibrated = true;
  bool probe_first = false;
  if (options_.memory_calibrator != nullptr) {
    const MemoryCalibrator::State state = options_.memory_calibrator->Find(*normalized).state;
    calibrated = state == MemoryCalibrator::State::kReady || state == MemoryCalibrator::State::kFailed;
    probe_first = !calibrated && LaunchesWithoutProbe(*normalized).empty();
  }
  absl::StatusOr<Plan> feasible = PlanOn(*normalized, /*only_free_devices=*/false);
  if (!feasible.ok()) {
    if (absl::IsUnavailable(feasible.status())) {
      return absl::InvalidArgumentError(absl::StrCat("spec.resources.min_devices: ", feasible.status().message(),
                                                     " on this node in all; lower min_devices"));
    }
    if (calibrated || !absl::IsResourceExhausted(feasible.status())) return feasible.status();
  }

  const int64_t order = next_submit_order_++;
  JobEntry entry;
  entry.record.submit_order = order;
  entry.record.token = NewToken();
  Job& job = entry.record.job;
  const std::string id = absl::StrFormat("j-%06d", order);
  job.set_id(id);
  job.set_owner(owner);
  job.set_request_id(request_id);
  *job.mutable_spec() = *std::move(normalized);
  *job.mutable_created_at() = ToProto(options_.clock());
  JobEntry& stored = jobs_[id] = std::move(entry);
  ids_by_order_[order] = id;
  if (!request_id.empty()) ids_by_request_[{owner, request_id}] = id;
  const std::string reason =
      probe_first ? "submitted; its workload's memory is measured first (fitrun-worker --probe)" : "submitted";
  // Durable before it is acknowledged (a job accepted is never dropped): admitting a new job stores
  // it with its first event, and a job the store refused never existed.
  if (absl::Status status = Transition(stored, fitrun::v1::JOB_STATE_QUEUED, reason); !status.ok()) {
    jobs_.erase(id);
    ids_by_order_.erase(order);
    if (!request_id.empty()) ids_by_request_.erase({owner, request_id});
    return status;
  }
  RequestSchedule();
  return stored.record.job;
}

absl::StatusOr<std::pair<JobSpec, Plan>> JobManager::DryRunPlan(JobSpec spec) {
  if (options_.data_roots.has_value()) {
    if (absl::Status allowed = options_.data_roots->Check(spec); !allowed.ok()) return allowed;
  }
  absl::StatusOr<JobSpec> normalized = NormalizeJobSpec(std::move(spec));
  if (!normalized.ok()) return normalized.status();
  if (options_.max_nodes > 0 && normalized->resources().min_nodes() > options_.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("spec.resources.min_nodes: ", normalized->resources().min_nodes(),
                                                   " nodes, but ", options_.max_nodes_reason));
  }
  absl::MutexLock lock(&mu_);
  // Never waits for a probe: an unmeasured workload is planned with the analytic estimate while
  // its measurement starts, and the plan says so.
  std::string without_probe;
  if (options_.memory_calibrator != nullptr) {
    without_probe = LaunchesWithoutProbe(*normalized);
  }
  const std::string calibrating =
      options_.memory_calibrator != nullptr && without_probe.empty() ? AwaitCalibration(*normalized) : "";
  absl::StatusOr<Plan> plan = PlanOn(*normalized, /*only_free_devices=*/true);
  if (absl::IsUnavailable(plan.status())) {
    // Busy devices: show the plan it gets once they free up.
    plan = PlanOn(*normalized, /*only_free_devices=*/false);
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
  } else if (options_.memory_calibrator != nullptr) {
    if (const std::string measuring = AwaitPlanMeasurement(*normalized, *plan); !measuring.empty()) {
      plan->add_reasons(absl::StrCat("before launch: ", measuring));
    }
  }
  return std::make_pair(*std::move(normalized), *std::move(plan));
}

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return it->second.record.job;
}

std::vector<Job> JobManager::List(const std::vector<JobState>& states) {
  const std::set<JobState> wanted(states.begin(), states.end());
  std::vector<const JobRecord*> records;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : jobs_) {
    if (wanted.empty() || wanted.count(entry.record.job.state())) records.push_back(&entry.record);
  }
  std::sort(records.begin(), records.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->submit_order < b->submit_order; });
  std::vector<Job> jobs;
  jobs.reserve(records.size());
  for (const JobRecord* record : records) jobs.push_back(record->job);
  return jobs;
}

JobManager::Page JobManager::ListPage(const std::vector<JobState>& states, int64_t after_order, int limit,
                                      const std::function<bool(const Job&)>& visible) {
  limit = std::max(limit, 1);
  const std::set<JobState> wanted(states.begin(), states.end());
  Page page;
  absl::MutexLock lock(&mu_);
  for (auto it = ids_by_order_.upper_bound(after_order); it != ids_by_order_.end(); ++it) {
    const Job& job = jobs_.at(it->second).record.job;
    if ((!wanted.empty() && wanted.count(job.state()) == 0) || !visible(job)) continue;
    if (static_cast<int>(page.jobs.size()) == limit) {
      // The last job returned, not the one found beyond it: the next page starts after it.
      page.next_order = jobs_.at(page.jobs.back().id()).record.submit_order;
      return page;
    }
    page.jobs.push_back(job);
  }
  return page;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  JobEntry& entry = it->second;
  if (IsTerminal(entry.record.job.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ended (",
                                                      JobStateName(entry.record.job.state()), ")"));
  }
  const std::string why = reason.empty() ? "cancelled by a user" : reason;
  entry.record.job.set_failure_reason(why);
  RecordAttemptOutcome(entry, absl::StrCat("cancelled: ", why));
  if (absl::Status status = Transition(entry, fitrun::v1::JOB_STATE_CANCELLED, why); !status.ok()) return status;
  if (entry.active) StopRanks(entry, why);
  MaybeReleaseAttempt(entry);
  return entry.record.job;
}

std::vector<fitrun::v1::Device> JobManager::Devices() {
  absl::MutexLock lock(&mu_);
  return DevicesLocked();
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
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  const Job& job = it->second.record.job;
  if (job.attempts() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has not started yet (",
                                                      JobStateName(job.state()), "); it has no logs"));
  }
  const int chosen = attempt > 0 ? attempt : job.attempts();
  if (chosen > job.attempts()) {
    return absl::InvalidArgumentError(absl::StrCat("attempt: job ", job_id, " has ", job.attempts(), " attempt(s)"));
  }
  const int world = job.attempt_history().empty() ? job.plan().device_ids_size()
                                                   : job.attempt_history(job.attempt_history_size() - 1).ranks_size();
  if (rank < 0 || rank >= std::max(1, world)) {
    return absl::InvalidArgumentError(absl::StrCat("rank: job ", job_id, " has ranks 0..", std::max(1, world) - 1));
  }
  LogFile log;
  log.attempt = chosen;
  log.path = (std::filesystem::path(JobDir(job_id)) / absl::StrCat("attempt-", chosen) / absl::StrCat("rank-", rank, ".log"))
                 .string();
  const auto& active = it->second.active;
  log.attempt_running = active && active->attempt == chosen && !active->ranks.at(rank).exited;
  return log;
}

// ---------------------------------------------------------------------------------------------------
// Workers

absl::StatusOr<WorkerKey> JobManager::AttachWorker(const fitrun::v1::Hello& hello,
                                                   std::weak_ptr<WorkerConnection> connection) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(hello.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("hello.job_id: no job '", hello.job_id(), "'"));
  JobEntry& entry = it->second;
  if (hello.job_token() != entry.record.token) {
    return absl::PermissionDeniedError("hello.job_token: does not match the job's token");
  }
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
  auto it = jobs_.find(key.job_id);
  if (it == jobs_.end()) return;
  JobEntry& entry = it->second;
  Job& job = entry.record.job;
  std::vector<JobEvent> events;
  for (const fitrun::v1::WorkerReport* report : reports) {
    // Checked per report: a finished rank below may end the attempt.
    if (!entry.active || entry.active->attempt != key.attempt) break;  // a late report of an older attempt
    RankState& rank = entry.active->ranks[key.rank];
    rank.last_heard = options_.clock();
    JobEvent event;
    switch (report->report_case()) {
      case fitrun::v1::WorkerReport::kProgress: {
        *event.mutable_progress() = report->progress();
        event.mutable_progress()->set_rank(key.rank);
        rank.peak_bytes = std::max(rank.peak_bytes, report->progress().peak_bytes());
        rank.last_step = std::max(rank.last_step, report->progress().step());
        rank.last_progress = event.progress();
        if (key.rank == 0) {
          const int64_t advanced = report->progress().step() - job.last_progress().step();
          *job.mutable_last_progress() = event.progress();
          metrics_->TrainingProgress(std::max<int64_t>(0, advanced));
          if (entry.recovering_since && job.state() == fitrun::v1::JOB_STATE_RUNNING) {
            const absl::Duration took = options_.clock() - *entry.recovering_since;
            entry.recovering_since.reset();
            metrics_->Recovered(took);
            JobEvent resumed;
            resumed.mutable_log()->set_rank(-1);
            resumed.mutable_log()->set_text(absl::StrFormat(
                "training resumed at step %d of attempt %d, %.1f s after the failure", report->progress().step(),
                key.attempt, absl::ToDoubleSeconds(took)));
            events.push_back(std::move(resumed));
          }
        }
        break;
      }
      case fitrun::v1::WorkerReport::kOom:
        *event.mutable_oom() = report->oom();
        event.mutable_oom()->set_rank(key.rank);
        // The OOM event goes out before the restart it leads to; the peers are stopped right away
        // instead of waiting in their next collective.
        events.push_back(event);
        (void)PublishAllLocked(entry, std::exchange(events, {}));
        rank.exiting_on_its_own = true;
        entry.active->out_of_memory = true;
        OnOutOfMemoryLocked(entry, event.oom());
        continue;
      case fitrun::v1::WorkerReport::kCheckpointSaved:
        *event.mutable_checkpoint_saved() = report->checkpoint_saved();
        event.mutable_checkpoint_saved()->set_rank(key.rank);
        metrics_->CheckpointSaved(absl::Seconds(report->checkpoint_saved().seconds()));
        break;
      case fitrun::v1::WorkerReport::kCheckpointFailed:
        *event.mutable_checkpoint_failed() = report->checkpoint_failed();
        event.mutable_checkpoint_failed()->set_rank(key.rank);
        metrics_->CheckpointFailed();
        break;
      case fitrun::v1::WorkerReport::kLog:
        *event.mutable_log() = report->log();
        event.mutable_log()->set_rank(key.rank);
        break;
      case fitrun::v1::WorkerReport::kFinished: {
        rank.finished = report->finished();
        rank.finished->set_rank(key.rank);
        if (rank.peak_bytes == 0) rank.peak_bytes = rank.finished->peak_bytes();
        *event.mutable_rank_finished() = *rank.finished;
        break;
      }
      case fitrun::v1::WorkerReport::kFailed:
        rank.failure_report = report->failed().reason();
        event.mutable_log()->set_rank(key.rank);
        event.mutable_log()->set_text(absl::StrCat("failed: ", report->failed().reason()));
        break;
      default:
        continue;  // heartbeats carry no event; a hello or nested batch here is ignored
    }
    events.push_back(std::move(event));
    if (report->report_case() == fitrun::v1::WorkerReport::kFinished) {
      // The rank_finished event goes out before whatever state change it leads to.
      (void)PublishAllLocked(entry, std::exchange(events, {}));
      MaybeSucceed(entry, /*deadline_passed=*/false);
    }
  }
  (void)PublishAllLocked(entry, std::move(events));
}

AllocationCallback JobManager::AllocationCallbackFor(const std::string& job_id, int attempt) {
  return [this, job_id, attempt](const AllocationStatus& status) { OnAllocation(job_id, attempt, status); };
}

void JobManager::OnAllocation(const std::string& job_id, int attempt, const AllocationStatus& status) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
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
  PublishLocked(entry, note);
  Persist(entry);
}

void JobManager::OnWorkerExit(const WorkerKey& key, const WorkerExit& exit) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(key.job_id);
  if (it == jobs_.end()) return;
  JobEntry& entry = it->second;
  if (!entry.active || entry.active->attempt != key.attempt) return;
  RankState& rank = entry.active->ranks[key.rank];
  if (rank.exited) return;
  rank.exited = true;
  rank.exit = exit;
  // An adopted worker's status is unknown; its final report says whether it finished.
  const bool clean = exit.status_known ? (exit.exit_code == 0 && exit.signal == 0) : rank.finished.has_value();
  if (!exit.status_known) rank.exit = WorkerExit{clean ? 0 : -1, 0, false};
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

  JobEvent event;
  auto* exited = event.mutable_rank_exited();
  exited->set_rank(key.rank);
  exited->set_exit_code(rank.exit.exit_code);
  exited->set_signal(rank.exit.signal);
  if (!clean) exited->set_log_tail(LogTail(rank.log_path));
  PublishLocked(entry, event);

  if (entry.record.job.state() == fitrun::v1::JOB_STATE_RUNNING) {
    if (!clean) {
      // One rank gone means its peers would wait in their next collective until a timeout: stop
      // them now, say which rank failed and why, and try again where that can help.
      std::string headline = !exit.status_known
                                 ? absl::StrCat("rank ", key.rank, " (adopted after a coordinator restart) exited before finishing")
                             : exit.signal != 0
                                 ? absl::StrCat("rank ", key.rank, " was killed by signal ", exit.signal)
                                 : absl::StrCat("rank ", key.rank, " exited with code ", exit.exit_code);
      absl::StrAppend(&headline, " (attempt ", key.attempt, ")");
      if (!rank.failure_report.empty()) absl::StrAppend(&headline, ": ", rank.failure_report);
      const std::string details =
          exited->log_tail().empty() ? "" : absl::StrCat("\nlast lines of its log:\n", exited->log_tail());
      FailureKind kind = FailureKind::kCrash;
      if (exit.status_known && exit.signal == 0 && exit.exit_code == fitrun::contract::launch::kExitOutOfMemory) {
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
      RequestSchedule();
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
  (void)Transition(entry, fitrun::v1::JOB_STATE_SUCCEEDED, reason);
}

void JobManager::StopRanks(JobEntry& entry, const std::string& reason) {
  if (!entry.active) return;
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
  if (!entry.active) return;
  for (const RankState& rank : entry.active->ranks) {
    if (!rank.exited) return;
  }
  const JobState state = entry.record.job.state();
  if (!IsTerminal(state) && state != fitrun::v1::JOB_STATE_RESTARTING) return;
  RecordAttemptMemory(entry);
  for (const std::string& device : entry.active->device_ids) device_owner_.erase(device);
  Job& job = entry.record.job;
  if (!job.attempt_history().empty()) {
    *job.mutable_attempt_history(job.attempt_history_size() - 1)->mutable_ended_at() = ToProto(options_.clock());
  }
  entry.active.reset();
  job.clear_allocation_status();
  Persist(entry);
  RequestSchedule();
}

// ---------------------------------------------------------------------------------------------------
// Scheduling and launching

void JobManager::SchedulerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    // Wake for new work, or in time for the earliest pending deadline.
    absl::Time wake = CheckHeartbeats(options_.clock());
    for (const auto& [id, entry] : jobs_) {
      if (entry.active && entry.active->awaiting_reports_until) {
        wake = std::min(wake, *entry.active->awaiting_reports_until);
      }
    }
    auto ready = [this] { return schedule_requested_ || shutting_down_; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
    if (shutting_down_) return;
    // A burst of submits, reports and exits is one pass, not one pass each: every pass walks the
    // queue under the lock the API's calls wait for.
    mu_.AwaitWithDeadline(absl::Condition(&shutting_down_), last_pass_ + options_.min_pass_spacing);
    if (shutting_down_) return;
    schedule_requested_ = false;

    const absl::Time now = options_.clock();
    for (auto& [id, entry] : jobs_) {
      if (entry.active && entry.active->awaiting_reports_until && *entry.active->awaiting_reports_until <= now) {
        entry.active->awaiting_reports_until.reset();
        MaybeSucceed(entry, /*deadline_passed=*/true);
        MaybeReleaseAttempt(entry);
      }
    }
    SchedulePass();
    last_pass_ = absl::Now();
  }
}

JobManager::SchedulingPassTimes JobManager::RunSchedulingPass() {
  absl::MutexLock lock(&mu_);
  return SchedulePass();
}

std::vector<JobManager::Placement> JobManager::PlaceQueuedJobs(int* queued_count) {
  std::vector<JobEntry*> queued;
  for (auto& [id, entry] : jobs_) {
    if (WaitsForPlacement(entry.record.job, entry.active.has_value())) queued.push_back(&entry);
  }
  *queued_count = static_cast<int>(queued.size());
  std::sort(queued.begin(), queued.end(),
            [](const JobEntry* a, const JobEntry* b) { return RunsBefore(a->record, b->record); });

  std::vector<DeviceCapacity> free_devices;
  for (const fitrun::v1::Device& device : DevicesLocked()) {
    if (device.job_id().empty()) free_devices.push_back({device.id(), device.free_bytes(), device.node()});
  }
  // What each workload still waits for, asked once per pass however many jobs share it, and the
  // workloads one job already waits in PLANNING for.
  std::map<std::string, std::string> awaiting;
  std::set<std::string> calibrating;
  std::map<std::string, std::string> launches_without_probe;
  std::vector<Placement> placements;
  for (JobEntry* entry : queued) {
    const JobSpec& spec = entry->record.job.spec();
    std::string without_probe;
    if (options_.memory_calibrator != nullptr) {
      if (entry->calibration_key.empty()) entry->calibration_key = CalibrationKey(spec);
      // Asked once per pass for jobs of one shape (a queue of thousands plans each shape once).
      const std::string shape = entry->record.job.oom_history().empty()
                                    ? absl::StrCat(entry->calibration_key, "|", spec.global_batch_size(), "|",
                                                   spec.resources().SerializeAsString())
                                    : "";
      auto known = shape.empty() ? launches_without_probe.end() : launches_without_probe.find(shape);
      if (known != launches_without_probe.end()) {
        without_probe = known->second;
      } else {
        without_probe = LaunchesWithoutProbe(entry->record.job);
        if (!shape.empty()) launches_without_probe.emplace(shape, without_probe);
      }
    }
    if (options_.memory_calibrator != nullptr && without_probe.empty()) {
      auto [it, first_asked] = awaiting.try_emplace(entry->calibration_key);
      if (first_asked) it->second = AwaitCalibration(spec);
      if (!it->second.empty()) {
        // Jobs behind may start meanwhile. One job per workload waits in PLANNING; the others stay
        // queued (their QUEUED reason says their memory is measured first).
        const bool first = calibrating.insert(entry->calibration_key).second;
        if (first || entry->record.job.state() == fitrun::v1::JOB_STATE_PLANNING) {
          placements.push_back({entry, absl::UnknownError(""), it->second});
        }
        continue;
      }
    }
    absl::StatusOr<Plan> plan = PlanForJob(entry->record.job, free_devices);
    if (absl::IsUnavailable(plan.status())) {
      // The head job waits for devices and nothing behind it jumps ahead, so a large job is never
      // starved by a stream of small ones.
      if (entry->record.job.state() == fitrun::v1::JOB_STATE_PLANNING) {
        placements.push_back({entry, std::move(plan), "", /*back_to_queue=*/true});
      }
      break;
    }
    std::string waiting;
    if (plan.ok()) {
      const std::set<std::string> taken(plan->device_ids().begin(), plan->device_ids().end());
      free_devices.erase(std::remove_if(free_devices.begin(), free_devices.end(),
                                        [&](const DeviceCapacity& d) { return taken.count(d.id) > 0; }),
                         free_devices.end());
      // Its devices stay out of this pass's free list while its batch is measured, and it keeps its
      // place in the queue on the next passes, so they are still there when the measurement is in.
      if (options_.memory_calibrator != nullptr) waiting = AwaitPlanMeasurement(spec, *plan);
      if (!without_probe.empty()) plan->add_reasons(without_probe);
    }
    placements.push_back({entry, std::move(plan), std::move(waiting)});
  }
  return placements;
}

JobManager::SchedulingPassTimes JobManager::SchedulePass() {
  SchedulingPassTimes times;
  const absl::Time start = absl::Now();
  std::vector<Placement> placements = PlaceQueuedJobs(&times.queued);
  const absl::Time placed = absl::Now();
  times.placing = placed - start;
  for (Placement& placement : placements) {
    JobEntry& entry = *placement.entry;
    if (!placement.waiting_for.empty()) {
      WaitInPlanning(entry, placement.waiting_for);
      continue;
    }
    if (placement.back_to_queue) {
      entry.waiting_for.clear();
      (void)Transition(entry, fitrun::v1::JOB_STATE_QUEUED,
                       absl::StrCat("memory measured; waiting for devices: ", placement.plan.status().message()));
      continue;
    }
    entry.waiting_for.clear();
    if (entry.record.job.state() != fitrun::v1::JOB_STATE_PLANNING) {
      if (absl::Status status = Transition(entry, fitrun::v1::JOB_STATE_PLANNING, "devices are free"); !status.ok()) {
        continue;
      }
    }
    if (!placement.plan.ok()) {
      entry.record.job.set_failure_reason(absl::StrCat("planning failed: ", placement.plan.status().message()));
      (void)Transition(entry, fitrun::v1::JOB_STATE_FAILED, entry.record.job.failure_reason());
      continue;
    }
    if (absl::Status status = LaunchAttempt(entry, *placement.plan); !status.ok()) {
      entry.record.job.set_failure_reason(absl::StrCat("launch failed: ", status.message()));
      (void)Transition(entry, fitrun::v1::JOB_STATE_FAILED, entry.record.job.failure_reason());
      MaybeReleaseAttempt(entry);
      continue;
    }
    ++times.placed;
  }
  times.launching = absl::Now() - placed;
  return times;
}

absl::Status JobManager::LaunchAttempt(JobEntry& entry, const Plan& plan) {
  Job& job = entry.record.job;
  const int attempt_number = job.attempts() + 1;
  job.set_attempts(attempt_number);
  *job.mutable_plan() = plan;

  JobEvent chosen;
  *chosen.mutable_plan_chosen()->mutable_plan() = plan;
  chosen.mutable_plan_chosen()->set_attempt(attempt_number);
  PublishLocked(entry, chosen);

  AttemptLaunchSettings settings;
  settings.worker_binary = options_.worker_binary;
  settings.worker_channel_address = options_.worker_channel_address;
  settings.worker_tls_ca = options_.worker_tls_ca;
  settings.dataset_cache_dir = options_.dataset_cache_dir;
  AttemptLaunch attempt{job.id(), attempt_number, {}};
  const std::vector<fitrun::v1::Device> inventory = devices_->Snapshot();
  absl::StatusOr<std::vector<WorkerLaunch>> launches =
      AssembleAttempt(job, entry.record.token, attempt_number, plan, inventory, JobDir(job.id()), settings);
  if (!launches.ok()) return launches.status();
  attempt.ranks = *std::move(launches);
  attempt.nodes.assign(plan.nodes().begin(), plan.nodes().end());
  attempt.ranks_per_node = plan.devices_per_node();
  for (const fitrun::v1::Device& device : inventory) {
    if (plan.device_ids_size() == 0 || device.id() != plan.device_ids(0)) continue;
    attempt.cpus_per_rank = std::max(1, device.cpu_threads());
    attempt.gpu_per_rank = device.kind() == fitrun::v1::DEVICE_KIND_CUDA;
    // A virtual CPU device's memory is host memory.
    if (device.kind() == fitrun::v1::DEVICE_KIND_CPU) attempt.memory_per_rank_bytes = device.total_bytes();
  }
  attempt.time_limit_minutes = job.spec().resources().time_limit_minutes();
  attempt.on_allocation = AllocationCallbackFor(job.id(), attempt_number);
  const std::string job_id = job.id();
  absl::StatusOr<LaunchedAttempt> launched =
      launcher_->Launch(attempt, [this, job_id, attempt_number](int rank, const WorkerExit& exit) {
        OnWorkerExit(WorkerKey{job_id, attempt_number, rank}, exit);
      });
  if (!launched.ok()) return absl::InternalError(absl::StrCat("launching the ranks: ", launched.status().message()));

  const int world_size = plan.device_ids_size();
  entry.active.emplace();
  ActiveAttempt& active = *entry.active;
  active.attempt = attempt_number;
  active.launch_handle = launched->handle;
  active.device_ids.assign(plan.device_ids().begin(), plan.device_ids().end());
  active.ranks.resize(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    device_owner_[active.device_ids[rank]] = {job.id(), rank};
    active.ranks[rank].log_path = attempt.ranks[rank].log_path;
    active.ranks[rank].pid = rank < static_cast<int>(launched->pids.size()) ? launched->pids[rank] : 0;
    active.ranks[rank].last_heard = options_.clock();
  }
  if (!job.has_started_at()) *job.mutable_started_at() = ToProto(options_.clock());
  fitrun::v1::AttemptRecord* record = job.add_attempt_history();
  record->set_attempt(attempt_number);
  for (const std::string& id : active.device_ids) record->add_device_ids(id);
  record->set_per_device_batch(plan.per_device_batch());
  record->set_grad_accum_steps(plan.grad_accum_steps());
  record->set_predicted_peak_bytes(plan.predicted().total_bytes());
  record->set_launch_handle(launched->handle);
  *record->mutable_started_at() = ToProto(options_.clock());
  for (int rank = 0; rank < world_size; ++rank) {
    fitrun::v1::RankOutcome* outcome = record->add_ranks();
    outcome->set_rank(rank);
    outcome->set_pid(active.ranks[rank].pid);
    // A rank that already exited (before this record existed) is on record too.
    if (active.ranks[rank].exited) {
      outcome->set_exited(true);
      outcome->set_exit_code(active.ranks[rank].exit.exit_code);
      outcome->set_signal(active.ranks[rank].exit.signal);
    }
  }
  return Transition(entry, fitrun::v1::JOB_STATE_RUNNING,
                    absl::StrCat("launched ", world_size, " rank(s) on ", absl::StrJoin(active.device_ids, ", ")));
}

// ---------------------------------------------------------------------------------------------------
// State, events, devices

absl::Status JobManager::Transition(JobEntry& entry, JobState to, const std::string& reason) {
  Job& job = entry.record.job;
  const JobState from = job.state();
  if (!TransitionAllowed(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id(), " cannot go from ", JobStateName(from), " to ",
                                                      JobStateName(to)));
  }
  job.set_state(to);
  if (IsTerminal(to)) *job.mutable_finished_at() = ToProto(options_.clock());
  JobEvent event;
  auto* changed = event.mutable_state_changed();
  changed->set_from(from);
  changed->set_to(to);
  changed->set_reason(reason);
  // A new job exists only once stored; a job that exists changes whatever the store says (and the
  // store's failure is logged).
  const bool admitting = from == fitrun::v1::JOB_STATE_UNSPECIFIED;
  if (absl::Status stored = PublishAllLocked(entry, {std::move(event)}, /*only_if_stored=*/admitting); !stored.ok()) {
    job.set_state(from);
    return absl::UnavailableError(absl::StrCat("could not store the job: ", stored.message()));
  }
  metrics_->JobStateChanged(from, to);
  if (IsTerminal(to) && !IsTerminal(from)) {
    const absl::Time created = FromProto(job.created_at());
    const absl::Time finished = FromProto(job.finished_at());
    const absl::Time launched = job.has_started_at() ? FromProto(job.started_at()) : finished;
    metrics_->JobEnded(to, launched - created, finished - created);
  }
  // A job counts against its owner's limit from its admission to its end.
  if (admitting && !IsTerminal(to)) ++open_jobs_by_owner_[job.owner()];
  if (!admitting && IsTerminal(to) && !IsTerminal(from)) {
    if (--open_jobs_by_owner_[job.owner()] <= 0) open_jobs_by_owner_.erase(job.owner());
  }
  return absl::OkStatus();
}

void JobManager::PublishLocked(JobEntry& entry, JobEvent event) {
  std::vector<JobEvent> events;
  events.push_back(std::move(event));
  (void)PublishAllLocked(entry, std::move(events));
}

absl::Status JobManager::PublishAllLocked(JobEntry& entry, std::vector<JobEvent> events, bool only_if_stored) {
  if (events.empty()) return absl::OkStatus();
  const std::string& job_id = entry.record.job.id();
  const absl::Time now = options_.clock();
  bool persist = false;
  bool rank0_progress = false;
  // Sequence, store, then fan out: a watcher never sees an event the store does not have.
  int64_t sequence = hub_.NextSequence(job_id);
  for (JobEvent& event : events) {
    const std::string kind = EventKind(event);
    if (kind == "state_changed" || kind == "plan_chosen" || kind == "rank_finished") persist = true;
    if (event.has_progress() && event.progress().rank() == 0) rank0_progress = true;
    event.set_job_id(job_id);
    event.set_sequence(sequence++);
    *event.mutable_time() = ToProto(now);
    metrics_->EventRecorded(kind);
  }
  entry.record.job.set_last_sequence(events.back().sequence());
  if (rank0_progress && now - entry.progress_persisted_at >= absl::Seconds(1)) {
    entry.progress_persisted_at = now;
    persist = true;
  }
  // The job, when it changed, in the same commit as its events.
  const absl::Status status = persist ? store_->AppendEventsAndPutJob(events, entry.record) : store_->AppendEvents(events);
  if (!status.ok()) {
    if (only_if_stored) return status;
    // The events still reach live watchers; the gap in the store is reported in the log.
    fprintf(stderr, "fitrund: could not store events %s/%lld..%lld%s: %s\n", job_id.c_str(),
            static_cast<long long>(events.front().sequence()), static_cast<long long>(events.back().sequence()),
            persist ? " with the job" : "", std::string(status.message()).c_str());
  }
  hub_.Publish(std::move(events));
  return status;
}

void JobManager::Persist(const JobEntry& entry) {
  if (absl::Status status = store_->PutJob(entry.record); !status.ok()) {
    fprintf(stderr, "fitrund: could not store job %s: %s\n", entry.record.job.id().c_str(),
            std::string(status.message()).c_str());
  }
}

std::vector<fitrun::v1::Device> JobManager::DevicesLocked() {
  std::vector<fitrun::v1::Device> devices = devices_->Snapshot();
  for (fitrun::v1::Device& device : devices) {
    auto owner = device_owner_.find(device.id());
    if (owner == device_owner_.end()) continue;
    const auto& [job_id, rank] = owner->second;
    device.set_job_id(job_id);
    device.set_rank(rank);
    auto job = jobs_.find(job_id);
    if (job == jobs_.end() || !job->second.active || rank >= static_cast<int>(job->second.active->ranks.size())) {
      continue;
    }
    if (!job->second.record.job.attempt_history().empty()) {
      device.set_planned_bytes(job->second.record.job.attempt_history().rbegin()->predicted_peak_bytes());
    }
    device.set_peak_bytes(job->second.active->ranks[rank].peak_bytes);
    // A virtual device's inventory does not see its rank's allocations (a GPU's NVML does): what is
    // free is what the rank has not reached.
    if (device.kind() == fitrun::v1::DEVICE_KIND_CPU) {
      device.set_free_bytes(std::max<int64_t>(0, device.total_bytes() - device.peak_bytes()));
    }
  }
  return devices;
}

std::vector<JobManager::RankView> JobManager::RanksLocked(const JobEntry& entry) const {
  const Job& job = entry.record.job;
  if (job.attempt_history().empty()) return {};
  const fitrun::v1::AttemptRecord& record = *job.attempt_history().rbegin();
  const bool live = entry.active.has_value() && entry.active->attempt == record.attempt();
  std::vector<RankView> ranks;
  for (int r = 0; r < record.device_ids_size(); ++r) {
    RankView view;
    view.rank = r;
    view.device_id = record.device_ids(r);
    view.planned_bytes = record.predicted_peak_bytes();
    if (live && r < static_cast<int>(entry.active->ranks.size())) {
      view.peak_bytes = entry.active->ranks[r].peak_bytes;
      view.last_progress = entry.active->ranks[r].last_progress;
    } else {
      view.peak_bytes = record.measured_peak_bytes();  // the attempt's highest, recorded per attempt
    }
    ranks.push_back(std::move(view));
  }
  return ranks;
}

std::vector<JobManager::RunningJob> JobManager::Running() {
  absl::MutexLock lock(&mu_);
  // A running attempt holds its devices until released, so the devices name every such job: a
  // scrape costs the devices, not every job ever stored.
  std::map<int64_t, const JobEntry*> by_order;
  for (const auto& [device, owner] : device_owner_) {
    const JobEntry& entry = jobs_.at(owner.first);
    if (entry.active) by_order[entry.record.submit_order] = &entry;
  }
  std::vector<RunningJob> running;
  for (const auto& [order, entry] : by_order) running.push_back({entry->record.job, RanksLocked(*entry)});
  return running;
}

absl::StatusOr<std::vector<JobManager::RankView>> JobManager::Ranks(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return RanksLocked(it->second);
}

absl::StatusOr<Plan> JobManager::PlanOn(const JobSpec& spec, bool only_free_devices) {
  absl::StatusOr<ModelProfile> profile = ProfileFor(spec);
  if (!profile.ok()) return profile.status();
  std::vector<DeviceCapacity> capacities;
  for (const fitrun::v1::Device& device : DevicesLocked()) {
    if (only_free_devices && !device.job_id().empty()) continue;
    // A free device's whole memory is the rank's; a busy one is planned as if idle.
    const int64_t bytes = only_free_devices ? device.free_bytes() : device.total_bytes();
    capacities.push_back({device.id(), bytes, device.node()});
  }
  return PlanJob(spec, *profile, capacities, options_.estimator, NodeLimits());
}

absl::StatusOr<Plan> JobManager::PlanForJob(const Job& job, const std::vector<DeviceCapacity>& devices) {
  absl::StatusOr<ModelProfile> profile = ProfileFor(job.spec());
  if (!profile.ok()) return profile.status();
  const ModelProfile corrected = ProfileAfterOutOfMemory(*profile, job.spec(), job.oom_history(), options_.estimator);
  PlanLimits limits = LimitsAfterOutOfMemory(job.oom_history());
  const PlanLimits nodes = NodeLimits();
  limits.max_nodes = nodes.max_nodes;
  limits.max_nodes_reason = nodes.max_nodes_reason;
  return PlanJob(job.spec(), corrected, devices, options_.estimator, limits);
}

PlanLimits JobManager::NodeLimits() const {
  PlanLimits limits;
  limits.max_nodes = options_.max_nodes;
  limits.max_nodes_reason = options_.max_nodes_reason;
  return limits;
}

absl::StatusOr<ModelProfile> JobManager::ProfileFor(const JobSpec& spec) const {
  if (options_.memory_calibrator == nullptr) return fitrun::server::ProfileFor(spec);
  return options_.memory_calibrator->ProfileFor(spec);
}

std::string JobManager::AwaitCalibration(const JobSpec& spec) {
  const MemoryCalibrator::State state = options_.memory_calibrator->Find(spec).state;
  if (state != MemoryCalibrator::State::kMissing && state != MemoryCalibrator::State::kMeasuring) return "";
  // The sweep measures up to the most one rank of this job can take in a micro-batch, and up to the
  // roomiest device's memory.
  const int64_t per_rank = spec.resources().per_device_batch() > 0
                               ? spec.resources().per_device_batch()
                               : spec.global_batch_size() / std::max(1, spec.resources().min_devices());
  int64_t roomiest = 0;
  for (const fitrun::v1::Device& device : DevicesLocked()) roomiest = std::max(roomiest, device.total_bytes());
  options_.memory_calibrator->StartCalibration(spec, per_rank, roomiest, calibration_callbacks_.Wrap([this] {
    absl::MutexLock lock(&mu_);
    RequestSchedule();
  }));
  return absl::StrCat("measuring memory: fitrun-worker --probe runs the workload at growing micro-batches, up to ",
                      per_rank, " or ", FormatBytes(roomiest));
}

std::string JobManager::LaunchesWithoutProbe(const JobSpec& spec) {
  Job unplanned;
  *unplanned.mutable_spec() = spec;
  return LaunchesWithoutProbe(unplanned);
}

std::string JobManager::LaunchesWithoutProbe(const Job& job) {
  const MemoryCalibrator::State state = options_.memory_calibrator->Find(job.spec()).state;
  if (state != MemoryCalibrator::State::kMissing && state != MemoryCalibrator::State::kMeasuring) return "";
  if (!AnalyticEstimateIsUpperBound(job.spec())) return "";
  std::vector<DeviceCapacity> every_device;
  for (const fitrun::v1::Device& device : DevicesLocked()) {
    every_device.push_back({device.id(), device.total_bytes(), device.node()});
  }
  absl::StatusOr<Plan> plan = PlanForJob(job, every_device);
  if (!plan.ok() || IsTight(*plan)) return "";
  return absl::StrCat("no memory probe: the analytic estimate, an upper bound, predicts ",
                      FormatBytes(plan->predicted().total_bytes()), " of ", FormatBytes(plan->usable_bytes()),
                      " usable, under half, so measuring cannot change the plan; the ranks' peaks are recorded "
                      "for the workload's calibration (a probe runs first only when memory is tight)");
}

std::string JobManager::AwaitPlanMeasurement(const JobSpec& spec, const Plan& plan) {
  if (spec.resources().per_device_batch() > 0) return "";  // a fixed batch is the user's call
  absl::StatusOr<ModelProfile> profile = ProfileFor(spec);
  if (!profile.ok() || !profile->measured.has_value()) return "";
  const int64_t batch = plan.per_device_batch();
  const MemoryCurve& curve = *profile->measured;
  if (curve.Measured(batch)) return "";
  const bool beyond = batch > curve.largest_batch();
  const bool tight = IsTight(plan);
  if (!beyond && !tight) return "";
  const bool queued = options_.memory_calibrator->StartMeasurement(
      spec, batch, plan.usable_bytes(), calibration_callbacks_.Wrap([this] {
        absl::MutexLock lock(&mu_);
        RequestSchedule();
      }));
  if (!queued && !options_.memory_calibrator->Measuring(spec, batch)) return "";  // it failed: go ahead
  return absl::StrCat("measuring the peak at per-device batch ", batch, " before launch (predicted ",
                      FormatBytes(plan.predicted().total_bytes()), " of ", FormatBytes(plan.usable_bytes()),
                      " usable, ", beyond ? curve.HowEstimated(batch) : "over half of it", ")");
}

void JobManager::WaitInPlanning(JobEntry& entry, const std::string& waiting_for) {
  if (entry.waiting_for == waiting_for) return;
  entry.waiting_for = waiting_for;
  if (entry.record.job.state() != fitrun::v1::JOB_STATE_PLANNING) {
    (void)Transition(entry, fitrun::v1::JOB_STATE_PLANNING, waiting_for);
    return;
  }
  JobEvent event;
  event.mutable_log()->set_rank(-1);
  event.mutable_log()->set_text(absl::StrCat("planning: ", waiting_for));
  PublishLocked(entry, std::move(event));
}

void JobManager::RecordAttemptMemory(JobEntry& entry) {
  Job& job = entry.record.job;
  if (!entry.active || entry.active->out_of_memory || job.attempt_history().empty()) return;
  fitrun::v1::AttemptRecord& record = *job.mutable_attempt_history(job.attempt_history_size() - 1);
  if (record.attempt() != entry.active->attempt || record.predicted_peak_bytes() <= 0) return;
  // A rank stopped before its second step has not allocated everything a step keeps; one that
  // finished has.
  const int64_t enough_steps = std::min<int64_t>(2, std::max<int64_t>(1, job.plan().total_steps()));
  int64_t measured = 0;
  for (const RankState& rank : entry.active->ranks) {
    if (rank.peak_bytes <= 0 || (rank.last_step < enough_steps && !rank.finished)) continue;
    measured = std::max(measured, rank.peak_bytes);
    metrics_->MemoryPredictionObserved(static_cast<double>(rank.peak_bytes) /
                                       static_cast<double>(record.predicted_peak_bytes()));
  }
  if (measured <= 0) return;
  record.set_measured_peak_bytes(measured);
  if (options_.memory_calibrator != nullptr) {
    options_.memory_calibrator->RecordRun(job.spec(), record.per_device_batch(), measured);
  }
}

std::string JobManager::JobDir(const std::string& job_id) const {
  return (std::filesystem::path(options_.jobs_dir) / job_id).string();
}

}  // namespace fitrun::server
