// What the job manager holds per job: its stored record and, while an attempt's ranks are (or may
// still be) alive, their state. The manager's parts (placement, report ingest) read and change it;
// everything here is guarded by the manager's lock.
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_ENTRY_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_ENTRY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/job_store.h"
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

struct RankState {
  int pid = 0;  // as the launcher reported it (0: not known)
  bool exited = false;
  // The highest peak bytes and latest step the rank's progress reports carried (the peak from its
  // RankFinished when it reported none: a script that reports no progress).
  int64_t peak_bytes = 0;
  int64_t last_step = 0;
  // On a GPU: the highest reserved and whole-process peaks it reported, beside peak_bytes (allocated).
  int64_t reserved_peak_bytes = 0;
  int64_t device_peak_bytes = 0;
  fitrun::v1::Progress last_progress;
  WorkerExit exit;
  std::optional<fitrun::v1::RankFinished> finished;
  std::string failure_report;  // from RankFailed
  // The rank reported an out-of-memory error and exits on its own with its own code and last
  // report; stopping the group does not SIGTERM it.
  bool exiting_on_its_own = false;
  std::weak_ptr<WorkerConnection> connection;
  // When the coordinator last heard from the rank (launch, adoption, any report): a rank silent
  // past spec.fault_tolerance.heartbeat_timeout_seconds is taken as hung.
  absl::Time last_heard = absl::InfinitePast();
  // What its reports may still take of the store and the watchers' memory (ReportIngest's budget:
  // bytes, refilled at a steady rate; -1 until its first report), and the reports dropped for want
  // of it since the job's events last said so.
  double report_budget_bytes = -1;
  absl::Time report_budget_at = absl::InfinitePast();
  int64_t reports_dropped = 0;
  absl::Time drops_told_at = absl::InfinitePast();
  // Its attempt's end as it reported it, once: a final or failure report, and an out-of-memory
  // report before it. Repeats are dropped (and counted in reports_dropped).
  bool end_reported = false;
  bool oom_reported = false;
  int64_t repeated_ends_dropped = 0;
};

struct ActiveAttempt {
  int attempt = 0;
  // From its devices' reservation until its ranks are started (outside the manager's lock) and the
  // launch is committed or rolled back: no launch handle yet, so nothing may stop or release it, and
  // its ranks' hellos, reports and exits wait for the commit.
  bool launching = false;
  std::string launch_handle;
  std::vector<std::string> device_ids;
  std::vector<RankState> ranks;
  // Set when every rank exited 0 but a final report is still missing.
  std::optional<absl::Time> awaiting_reports_until;
  // A rank ran out of memory: the attempt's peaks say nothing about what fits.
  bool out_of_memory = false;
  // A cluster's scheduler has not granted the ranks their nodes yet: silence is not a hang.
  bool allocation_pending = false;
  // A script's first steps have measured the attempt's batch (first_steps.h), and where that lets
  // the plan take a larger batch, the plan it moves to at its next checkpoint.
  bool first_steps_measured = false;
  std::optional<fitrun::v1::Plan> move_at_checkpoint;
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
  // Rank reports not kept because the job had stored ReportIngest's cap of events.
  int64_t reports_over_event_cap = 0;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_ENTRY_H_
