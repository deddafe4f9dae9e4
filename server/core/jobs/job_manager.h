// The job manager: the front of the coordinator's job lifecycle. It owns the one lock and the
// scheduler thread, and hands each call to the room whose job it is:
//   JobTable        every job, the one state machine (Transition), the store and the watchers
//   Scheduler       which queued jobs start now and where, what the others wait for, API plans
//   Attempts        an attempt from its reservation to its release: exits, heartbeats, failures,
//                   success, the take-over after a coordinator restart
//   WorkerSessions  ranks' hellos and reports
//   RunMemory       what a run taught about memory (calibration, device costs, first steps)
//   DeviceHolders   which rank holds which device; job_views.h what the API shows of them
// Admission (which specs are accepted) and JobPlanner (a plan from spec, devices and calibration)
// need no lock. The rooms know nothing of each other but through the pointers they are given, and
// none knows the manager: they ask for a scheduling pass through the table, and a launched
// attempt's exits come back through the callbacks Attempts is given.
//
// Thread-safety: all methods may be called from any thread (gRPC handlers, launcher exit threads).
// One mutex guards every room; event listeners run under it and must not call back into the
// manager. Nothing slow runs under it: specs' files are read before it is taken, and an attempt's
// directory, cgroup and processes (or a cluster's sbatch) are made with it released (see
// LaunchReserved).
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
#include "server/core/calibration/device_costs_book.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/core/calibration/planning_gate.h"
#include "server/core/coordinator_metrics.h"
#include "server/core/device_inventory.h"
#include "server/core/job_store.h"
#include "server/core/jobs/admission.h"
#include "server/core/jobs/attempt_launch.h"
#include "server/core/jobs/attempts.h"
#include "server/core/jobs/device_holders.h"
#include "server/core/jobs/event_hub.h"
#include "server/core/jobs/failure_policy.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/jobs/job_planner.h"
#include "server/core/jobs/job_table.h"
#include "server/core/jobs/job_views.h"
#include "server/core/jobs/placement.h"
#include "server/core/jobs/report_ingest.h"
#include "server/core/jobs/run_memory.h"
#include "server/core/jobs/scheduler.h"
#include "server/core/jobs/worker_sessions.h"
#include "server/core/memory/estimator.h"
#include "server/core/memory/planner.h"
#include "server/core/specs/data_roots.h"
#include "server/core/worker_launcher.h"

namespace fitrun::server {

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
    // What a script job's ranks run (fitrun-supervisor); empty: worker_binary.
    std::string script_binary;
    // The WorkerChannel address workers dial (FITRUN_COORDINATOR).
    std::string worker_channel_address;
    // When fitrund serves TLS: the CA file ranks verify it with (FITRUN_TLS_CA); empty: plain text.
    std::string worker_tls_ca;
    // Where ranks keep decoded datasets (WorkerAssignment.dataset_cache_dir, absolute); empty: none.
    std::string dataset_cache_dir;
    // Where specs' files may lie (server/core/specs/data_roots.h); unset: anywhere (the core's tests).
    std::optional<DataRoots> data_roots;
    // Jobs one owner may have queued or running at once (RESOURCE_EXHAUSTED beyond); 0: no limit.
    int max_open_jobs_per_owner = 0;
    // Events one job stores before its ranks' progress, log and checkpoint reports are no longer kept
    // (ReportIngest::Options); 0: no cap.
    int64_t max_events_per_job = ReportIngest::kDefaultMaxEventsPerJob;
    // Ended jobs kept (Retention): older ones are forgotten, in memory and in the store; 0: all.
    int64_t retain_finished_jobs = 10000;
    // The operator's ceilings on one rank's host memory and tasks (specs above them are refused; a
    // rank's default host memory stays under), and the host memory every running job's ranks may be
    // promised together on this host (plans take fewer devices, or wait, beyond it); 0: none, as on
    // a cluster whose scheduler bounds its nodes.
    int64_t max_rank_host_memory_bytes = 0;
    int64_t max_rank_processes = 0;
    int64_t host_memory_bytes = 0;
    // The lowest uid a job's Unix account may have (Admission::Options).
    uid_t min_account_uid = 1000;
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
    // What GPU runs taught about each GPU model's costs beyond the tensors; nullptr: the defaults
    // measured on an H100 (memory/device_costs.h). Must outlive the manager.
    DeviceCostsBook* device_costs = nullptr;
    // The caching allocator's settings ranks on GPUs run with (PYTORCH_CUDA_ALLOC_CONF), unless a
    // script's spec.script.env sets its own.
    std::string cuda_allocator_config = kDefaultCudaAllocatorConfig;
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
  // submit with it created is returned (INVALID_ARGUMENT when its spec differs). A non-empty
  // `run_as` is the Unix account the job's processes run as (the owner's): the spec's files are read
  // with its rights at submit, and its ranks and probes run as it.
  absl::StatusOr<fitrun::v1::Job> Submit(fitrun::v1::JobSpec spec, const std::string& owner = "",
                                         const std::string& request_id = "", const std::string& run_as = "");
  // The normalized spec and the plan it would get now (its files read as `run_as`, as Submit's);
  // nothing is stored.
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> DryRunPlan(fitrun::v1::JobSpec spec,
                                                                              const std::string& run_as = "");
  absl::StatusOr<fitrun::v1::Job> Get(const std::string& job_id);
  std::vector<fitrun::v1::Job> List(const std::vector<fitrun::v1::JobState>& states);
  // One page of jobs in submission order (JobTable::ListPage).
  using Page = JobTable::Page;
  Page ListPage(const std::vector<fitrun::v1::JobState>& states, int64_t after_order, int limit,
                const std::function<bool(const fitrun::v1::Job&)>& visible);
  absl::StatusOr<fitrun::v1::Job> Cancel(const std::string& job_id, const std::string& reason);
  // Every device, with the job and rank holding it and that rank's planned and peak bytes.
  std::vector<fitrun::v1::Device> Devices();
  // The same as a caller sees them: a device held by a job `visible` rejects shows neither the job
  // nor the rank, only Device.held_by_another_user.
  std::vector<fitrun::v1::Device> Devices(const std::function<bool(const fitrun::v1::Job&)>& visible);

  // ---- monitoring (metrics scrapes, the web page) ----
  using RankView = ::fitrun::server::RankView;
  using RunningJob = ::fitrun::server::RunningJob;
  // Jobs with an attempt whose ranks are (or may still be) alive, in submission order.
  std::vector<RunningJob> Running();
  // The ranks of the job's running attempt, or of its last one once it has none (peaks from the
  // attempt's record); empty for a job never launched. NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<RankView>> Ranks(const std::string& job_id);

  // Events with sequence >= from_sequence (up to limit), from memory or, for old ones, the store.
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                               int limit);
  EventHub& events() { return hub_; }

  // Where a rank's log is, for the given attempt (0: the latest), and whether that attempt still runs
  // (FindRankLog).
  using LogFile = RankLogFile;
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
  static bool IsTerminal(fitrun::v1::JobState state) { return JobTable::IsTerminal(state); }

 private:
  JobManager(Options options, JobStore* store, DeviceInventory* devices, WorkerLauncher* launcher,
             CoordinatorMetrics* metrics);
  absl::Status LoadStoredJobs();

  // The scheduler thread: a pass whenever the job table asks for one (JobTable::RequestPass), at
  // most one per min_pass_spacing, and heartbeats and late-report deadlines checked in time.
  void SchedulerLoop();
  // An attempt is launched in two phases, so that nothing slow (the job's directory, its cgroup,
  // spawning ranks, a cluster's sbatch) runs under the lock every API call waits for:
  // Attempts::Reserve (locked, from Scheduler::PlaceQueued) takes the plan's devices and marks the
  // attempt launching; StartRanks (attempt_launch.h, unlocked) writes the job's directory and starts
  // the ranks; Attempts::Commit (locked) commits the attempt (RUNNING) or rolls it back.
  //
  // One pass's placing half, under the lock: returns the attempts to start.
  std::vector<PendingLaunch> PlacePass(SchedulingPassTimes& times) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The launching half: each attempt started with the lock released, then committed under it.
  void LaunchReserved(std::vector<PendingLaunch> launches, SchedulingPassTimes& times)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (the lock released meanwhile) until the job has no attempt in its launch's unlocked
  // phase: a rank's hello, reports and exit are taken once its attempt is committed, as they were
  // when the launch held the lock.
  void AwaitLaunched(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the launcher calls when a rank of the job's attempt exits: reads the rank's log tail, when
  // the exit may be a failure, before it takes the lock (the file is the job's), then OnWorkerExit.
  WorkerLauncher::RankExitCallback ExitCallbackFor(const fitrun::v1::Job& job, int attempt);
  void OnWorkerExit(const WorkerKey& key, const WorkerExit& exit, const std::string& log_tail);
  // The launcher's word on an attempt's allocation (a cluster scheduler's PENDING and its reason).
  void OnAllocation(const std::string& job_id, int attempt, const AllocationStatus& status);
  AllocationCallback AllocationCallbackFor(const std::string& job_id, int attempt);
  // Deletes forgotten jobs' rows from the store (JobTable::ForgetExcess); outside the lock.
  void DeleteJobRows(const std::vector<std::string>& job_ids) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  // Plans from specs, devices and calibration; holds no job and needs no lock.
  const JobPlanner planner_;
  JobStore* const store_;
  WorkerLauncher* const launcher_;
  EventHub hub_;
  // Immutable: specs are checked outside the lock (they read the spec's files).
  const Admission admission_;
  // What StartRanks needs of the options, with the lock released.
  const AttemptLaunchSettings launch_settings_;

  // The rooms, each guarded as a whole by the one lock: the jobs and their states, who holds which
  // device, what runs taught about memory, attempts, the ranks' sessions and the scheduler's passes.
  absl::Mutex mu_;
  JobTable table_ ABSL_GUARDED_BY(mu_);
  DeviceHolders holders_ ABSL_GUARDED_BY(mu_);
  RunMemory run_memory_ ABSL_GUARDED_BY(mu_);
  Attempts attempts_ ABSL_GUARDED_BY(mu_);
  WorkerSessions sessions_ ABSL_GUARDED_BY(mu_);
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  // Jobs the table forgot, whose rows the scheduler deletes from the store outside the lock.
  std::vector<std::string> forgotten_ ABSL_GUARDED_BY(mu_);
  absl::Time last_pass_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread scheduler_thread_;
  // Last but for the gate that holds its callback, so they go first: a probe ending after the
  // manager is gone wakes nothing.
  CallbackGuard calibration_callbacks_;
  PlanningGate gate_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_H_
