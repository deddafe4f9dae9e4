// The job manager: every job's lifecycle, from submission to its end, in one place.
//
// It validates and stores jobs, runs the scheduler (a thread of its own), plans each job against
// the free devices, launches one worker per device through the WorkerLauncher, turns worker reports
// and process exits into events and state changes, and stops every rank of a job at once when one
// fails or the job is cancelled. State transitions are checked in one function (Transition). What a
// failed attempt leads to (re-plan after an OOM, restart after a crash or a hang, or the job's end) and
// how a restarted coordinator takes over its predecessor's ranks live in job_manager_recovery.cc.
//
// Thread-safety: all methods may be called from any thread (gRPC handlers, launcher exit threads).
// One mutex guards the jobs; event listeners run under it and must not call back into the manager.
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "fitrun/v1/job.pb.h"
#include "fitrun/v1/worker.pb.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/device_inventory.h"
#include "server/core/memory/estimator.h"
#include "server/core/spec/data_roots.h"
#include "server/core/jobs/event_hub.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/core/job_store.h"
#include "server/core/memory/planner.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

// The coordinator's end of one rank's report stream, for sending commands down.
class WorkerConnection {
 public:
  virtual ~WorkerConnection() = default;
  virtual void SendStop(const std::string& reason) = 0;
};

// Identifies one rank of one attempt of a job.
struct WorkerKey {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
};

class JobManager {
 public:
  struct Options {
    std::string state_dir;
    // Jobs' directories (attempt logs, assignments, checkpoints); empty: <state_dir>/jobs. Ranks on
    // other machines need it on storage they see at the same path.
    std::string jobs_dir;
    // The most nodes a plan may span (0: any), and why, for a spec that asks for more.
    int max_nodes = 1;
    std::string max_nodes_reason = "fitrund runs ranks on this machine only (fitrund --cluster=slurm spans nodes)";
    std::string worker_binary;
    // The WorkerChannel address workers dial (FITRUN_COORDINATOR).
    std::string worker_channel_address;
    // When fitrund serves TLS: the CA file ranks verify it with (FITRUN_TLS_CA); empty: plain text.
    std::string worker_tls_ca;
    // Where ranks keep decoded datasets (WorkerAssignment.dataset_cache_dir, absolute); empty: none.
    std::string dataset_cache_dir;
    // Where specs' files may lie (server/core/spec/data_roots.h); unset: anywhere (the core's tests).
    std::optional<DataRoots> data_roots;
    // Jobs one owner may have queued or running at once (RESOURCE_EXHAUSTED beyond); 0: no limit.
    int max_open_jobs_per_owner = 0;
    // How long a stopped rank has between SIGTERM and SIGKILL.
    absl::Duration stop_grace = absl::Seconds(2);
    // After every rank exited 0, how long to wait for reports still in flight before finishing.
    absl::Duration final_report_wait = absl::Seconds(3);
    // Whether Shutdown stops running ranks. Off by default: ranks keep training and a restarted
    // coordinator re-adopts them, so restarting the daemon never costs a job its progress.
    bool stop_workers_on_shutdown = false;
    // Off only in benchmarks and tests that drive RunSchedulingPass themselves.
    bool run_scheduler_thread = true;
    // The scheduler thread's passes are at least this far apart, so a burst of changes is one pass.
    absl::Duration min_pass_spacing = absl::Milliseconds(5);
    EstimatorOptions estimator;
    // Measures each workload's memory (fitrun-worker --probe) for calibrated plans, on its own
    // threads: a job whose workload is not measured yet waits in PLANNING, as does one whose plan's
    // batch is measured before launch (see NeedsMeasurement); nullptr: analytic estimates only.
    // Must outlive the manager.
    MemoryCalibrator* memory_calibrator = nullptr;
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  // Loads the stored jobs and starts the scheduler. Dependencies must outlive the manager.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(Options options, JobStore* store,
                                                            DeviceInventory* devices, WorkerLauncher* launcher,
                                                            CoordinatorMetrics* metrics);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Stops the scheduler (and running ranks, if the options say so). Idempotent; the destructor calls it.
  void Shutdown();

  // ---- the public API (called by the gRPC service) ----
  // `owner`: the submitting user, recorded on the job (who may see and act on it is the service's
  // decision). A non-empty `request_id` makes the submit idempotent per owner: the job an earlier
  // submit with it created is returned (INVALID_ARGUMENT when its spec differs).
  absl::StatusOr<fitrun::v1::Job> Submit(fitrun::v1::JobSpec spec, const std::string& owner = "",
                                         const std::string& request_id = "");
  // The normalized spec and the plan it would get now; nothing is stored.
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> DryRunPlan(fitrun::v1::JobSpec spec);
  absl::StatusOr<fitrun::v1::Job> Get(const std::string& job_id);
  std::vector<fitrun::v1::Job> List(const std::vector<fitrun::v1::JobState>& states);
  // One page of jobs in submission order: those after `after_order` (a page's last job's
  // submit_order) whose state is in `states` (empty: any) and that `visible` accepts, `limit` at
  // most. `next_order` is set to the last one's order when more may follow, else to 0.
  struct Page {
    std::vector<fitrun::v1::Job> jobs;
    int64_t next_order = 0;
  };
  Page ListPage(const std::vector<fitrun::v1::JobState>& states, int64_t after_order, int limit,
                const std::function<bool(const fitrun::v1::Job&)>& visible);
  absl::StatusOr<fitrun::v1::Job> Cancel(const std::string& job_id, const std::string& reason);
  // Every device, with the job and rank holding it and that rank's planned and peak bytes.
  std::vector<fitrun::v1::Device> Devices();

  // ---- monitoring (metrics scrapes, the web page) ----
  // One rank of an attempt: where it runs, the plan's predicted peak for it, the highest peak it
  // reported, and its latest progress report (empty before the first).
  struct RankView {
    int rank = 0;
    std::string device_id;
    int64_t planned_bytes = 0;
    int64_t peak_bytes = 0;
    fitrun::v1::Progress last_progress;
  };
  struct RunningJob {
    fitrun::v1::Job job;
    std::vector<RankView> ranks;
  };
  // Jobs with an attempt whose ranks are (or may still be) alive, in submission order.
  std::vector<RunningJob> Running();
  // The ranks of the job's running attempt, or of its last one once it has none (peaks from the
  // attempt's record); empty for a job never launched. NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<RankView>> Ranks(const std::string& job_id);

  // Events with sequence >= from_sequence (up to limit), from memory or, for old ones, the store.
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                               int limit);
  EventHub& events() { return hub_; }

  // Where a rank's log is, for the given attempt (0: the latest), and whether that attempt still runs.
  struct LogFile {
    std::string path;
    int attempt = 0;
    bool attempt_running = false;
  };
  absl::StatusOr<LogFile> RankLog(const std::string& job_id, int rank, int attempt);

  // ---- the worker side (called by the WorkerChannel service) ----
  // Checks the Hello (job, attempt, rank, token) and registers the connection for commands.
  absl::StatusOr<WorkerKey> AttachWorker(const fitrun::v1::Hello& hello, std::weak_ptr<WorkerConnection> connection);
  // A report, or a ReportBatch handled report by report.
  void OnWorkerReport(const WorkerKey& key, const fitrun::v1::WorkerReport& report);
  // Several reports of one rank under one lock: their events are stored in one transaction (a group
  // commit) and published together. Hellos and nested batches are skipped.
  void OnWorkerReports(const WorkerKey& key, absl::Span<const fitrun::v1::WorkerReport* const> reports);

  // One scheduling pass, as the scheduler thread runs it after every change: place queued jobs on
  // free devices, then launch them. Returns how long each half took.
  struct SchedulingPassTimes {
    absl::Duration placing;
    absl::Duration launching;
    int queued = 0;
    int placed = 0;
  };
  SchedulingPassTimes RunSchedulingPass();

  // Whether a state is final (no more events will follow its StateChanged).
  static bool IsTerminal(fitrun::v1::JobState state);

 private:
  struct RankState {
    int pid = 0;  // as the launcher reported it (0: not known)
    bool exited = false;
    // The highest peak bytes and latest step the rank's progress reports carried (the peak from its
    // RankFinished when it reported none: a script that reports no progress).
    int64_t peak_bytes = 0;
    int64_t last_step = 0;
    fitrun::v1::Progress last_progress;
    WorkerExit exit;
    std::optional<fitrun::v1::RankFinished> finished;
    std::string failure_report;  // from RankFailed
    // The rank reported an out-of-memory error and exits on its own with its own code and last
    // report; stopping the group does not SIGTERM it.
    bool exiting_on_its_own = false;
    std::string log_path;
    std::weak_ptr<WorkerConnection> connection;
    // When the coordinator last heard from the rank (launch, adoption, any report): a rank silent
    // past spec.fault_tolerance.heartbeat_timeout_seconds is taken as hung.
    absl::Time last_heard = absl::InfinitePast();
  };
  struct ActiveAttempt {
    int attempt = 0;
    std::string launch_handle;
    std::vector<std::string> device_ids;
    std::vector<RankState> ranks;
    // Set when every rank exited 0 but a final report is still missing.
    std::optional<absl::Time> awaiting_reports_until;
    // A rank ran out of memory: the attempt's peaks say nothing about what fits.
    bool out_of_memory = false;
    // A cluster's scheduler has not granted the ranks their nodes yet: silence is not a hang.
    bool allocation_pending = false;
  };
  struct JobEntry {
    JobRecord record;
    std::optional<ActiveAttempt> active;
    // Progress rewrites the stored job at most once a second; the events hold every report.
    absl::Time progress_persisted_at = absl::InfinitePast();
    // When the failure that the job is recovering from was detected, until training resumes.
    std::optional<absl::Time> recovering_since;
    // What the job waits for in PLANNING (its memory being measured), as last told to its watchers.
    std::string waiting_for;
    // Its workload's CalibrationKey, computed once (scheduling passes look it up for every queued job).
    std::string calibration_key;
  };

  // What ended an attempt early, which decides whether and how the job is tried again.
  enum class FailureKind {
    kOutOfMemory,  // re-plan with a smaller per-device batch (spec.fault_tolerance.max_oom_retries)
    kCrash,        // restart the group as it was (spec.fault_tolerance.max_restarts)
    kHang,         // a rank went silent: restart the group (max_restarts)
    kBadConfig,    // the worker refused the job's configuration: trying again cannot help
  };
  // The reason label of fitrun_job_restarts_total.
  static const char* FailureKindLabel(FailureKind kind);

  JobManager(Options options, JobStore* store, DeviceInventory* devices, WorkerLauncher* launcher,
             CoordinatorMetrics* metrics);
  absl::Status LoadStoredJobs();

  void SchedulerLoop();
  SchedulingPassTimes SchedulePass() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A queued job and what the scheduler decided for it: launch with a plan, fail (the planner's
  // error), wait in PLANNING while its memory is measured (`waiting_for` says what), or go back to
  // QUEUED until devices free up (`back_to_queue`, for a job that waited in PLANNING).
  struct Placement {
    JobEntry* entry;
    absl::StatusOr<fitrun::v1::Plan> plan;
    std::string waiting_for;
    bool back_to_queue = false;
  };
  // Decides, without side effects, which queued jobs start now and where, in queue order: the
  // devices of each placed job are taken out of the free list before the next job is planned.
  std::vector<Placement> PlaceQueuedJobs(int* queued) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RequestSchedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { schedule_requested_ = true; }
  // Launches every rank of the job on the plan's devices; on failure stops those started.
  absl::Status LaunchAttempt(JobEntry& entry, const fitrun::v1::Plan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWorkerExit(const WorkerKey& key, const WorkerExit& exit);
  // The launcher's word on an attempt's allocation (a cluster scheduler's PENDING and its reason).
  void OnAllocation(const std::string& job_id, int attempt, const AllocationStatus& status);
  AllocationCallback AllocationCallbackFor(const std::string& job_id, int attempt);
  // The node bound of options_ on top of the spec's own.
  PlanLimits NodeLimits() const;
  void StopRanks(JobEntry& entry, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the attempt's devices once none of its processes is alive.
  void MaybeReleaseAttempt(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSucceed(JobEntry& entry, bool deadline_passed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a coordinator restart: takes over the running attempt's workers if every one is alive,
  // otherwise stops the survivors and restarts the job from its last checkpoint.
  void RecoverRunningJob(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running attempt failed: stops every rank at once and either restarts the job (RESTARTING, re-planned
  // on the next scheduling pass) or, past the spec's limits, fails it. `headline` says what happened in
  // one line; `details` (e.g. a log tail) only goes into the failure reason.
  void HandleAttemptFailure(JobEntry& entry, FailureKind kind, const std::string& headline,
                            const std::string& details = "") ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnOutOfMemoryLocked(JobEntry& entry, const fitrun::v1::OutOfMemory& oom) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails over every running attempt with a rank silent past its heartbeat timeout; returns when the
  // next rank would time out (InfiniteFuture if none can).
  absl::Time CheckHeartbeats(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes over the still-living workers of the job's last recorded attempt (after a coordinator
  // restart); returns how many it adopted. The attempt becomes the job's active one.
  int AdoptLastAttempt(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current attempt's record with `outcome` (first outcome wins).
  void RecordAttemptOutcome(JobEntry& entry, const std::string& outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration StopGrace(const JobEntry& entry) const;

  // The one place job states change: checks the transition, persists, publishes the event.
  // FAILED_PRECONDITION for a transition not allowed; UNAVAILABLE when a new job (from UNSPECIFIED)
  // could not be stored, which is then not admitted: nothing is published or counted.
  absl::Status Transition(JobEntry& entry, fitrun::v1::JobState to, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked(JobEntry& entry, fitrun::v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sequences, stores (one transaction, with the job when a state change, plan or finish changed
  // it), then fans out events of one job, in order. Returns the store's verdict; with
  // `only_if_stored`, events the store refused are not fanned out.
  absl::Status PublishAllLocked(JobEntry& entry, std::vector<fitrun::v1::JobEvent> events, bool only_if_stored = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Persist(const JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Every device, with the memory a plan may use and, while a rank holds it, its job, rank, planned
  // and peak bytes.
  std::vector<fitrun::v1::Device> DevicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<RankView> RanksLocked(const JobEntry& entry) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<fitrun::v1::Plan> PlanOn(const fitrun::v1::JobSpec& spec, bool only_free_devices)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan for a queued or restarting job on `devices`, with what its earlier attempts' out-of-memory
  // errors taught (a smaller per-device batch, a corrected per-sample cost).
  absl::StatusOr<fitrun::v1::Plan> PlanForJob(const fitrun::v1::Job& job, const std::vector<DeviceCapacity>& devices)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string JobDir(const std::string& job_id) const;
  // The spec's model profile, calibrated when the memory probe has measured it. A member of the same
  // name as workloads.h's free function, so every plan the manager makes uses it.
  absl::StatusOr<ModelProfile> ProfileFor(const fitrun::v1::JobSpec& spec) const;
  // What the job's workload still needs measured before it can be planned, with the probe queued on
  // the calibrator's threads (its end schedules again); empty when nothing.
  std::string AwaitCalibration(const fitrun::v1::JobSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the job launches on its analytic estimate without waiting for its workload's probe, or empty
  // when it waits: it does when the workload is measured already, when its analytic estimate is not
  // a checked upper bound, or when the plan it gets (with what its OOMs taught, on every device as
  // if idle) is tight. Otherwise the probe could not change the plan: the estimate would fit even if
  // it were half the truth.
  std::string LaunchesWithoutProbe(const fitrun::v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string LaunchesWithoutProbe(const fitrun::v1::JobSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the plan still needs measured before it launches: its batch, when its predicted peak is
  // tight (over half the usable memory) or beyond the largest measured batch and not measured yet;
  // the measurement is queued. Empty when nothing (or when that measurement failed: the plan goes).
  std::string AwaitPlanMeasurement(const fitrun::v1::JobSpec& spec, const fitrun::v1::Plan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the job's watchers what it waits for in PLANNING (a state change into PLANNING, or a log
  // line when it is there already); nothing when that has not changed.
  void WaitInPlanning(JobEntry& entry, const std::string& waiting_for) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The memory a finished attempt's ranks reported against its plan: recorded on the attempt, in the
  // metrics, and with the calibrator, which corrects the workload's curve from it.
  void RecordAttemptMemory(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  JobStore* const store_;
  DeviceInventory* const devices_;
  WorkerLauncher* const launcher_;
  CoordinatorMetrics* const metrics_;
  EventHub hub_;

  absl::Mutex mu_;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  // Job ids by submission order (for paging) and by (owner, request_id) (for idempotent submits).
  std::map<int64_t, std::string> ids_by_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, std::string> ids_by_request_ ABSL_GUARDED_BY(mu_);
  // Jobs not yet ended, by owner (what max_open_jobs_per_owner bounds).
  std::map<std::string, int> open_jobs_by_owner_ ABSL_GUARDED_BY(mu_);
  // device id -> (job id, rank) of the rank holding it.
  std::map<std::string, std::pair<std::string, int>> device_owner_ ABSL_GUARDED_BY(mu_);
  int64_t next_submit_order_ ABSL_GUARDED_BY(mu_) = 1;
  bool schedule_requested_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_pass_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread scheduler_;
  // Last, so it goes first: a probe ending after the manager is gone wakes nothing.
  CallbackGuard calibration_callbacks_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_H_
