// What the job manager shows of its jobs beyond their records: an attempt's ranks with their planned
// and peak memory and latest progress, the jobs running now, where a rank's log is, and the devices
// as one caller may see them. Plain functions over the job table and the device holders, which the
// caller holds under the manager's lock; none changes a job.
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_VIEWS_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_VIEWS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/jobs/device_holders.h"
#include "server/core/jobs/job_entry.h"
#include "server/core/jobs/job_table.h"

namespace fitrun::server {

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

// Where a rank's log is, for one attempt, and whether that attempt still runs. The job's processes
// control the file: open it with OpenRankLog (job_directory.h), as run_as, never under a lock.
struct RankLogFile {
  std::string job_dir;
  std::string run_as;
  int attempt = 0;
  int rank = 0;
  bool attempt_running = false;
};

// The ranks of the job's running attempt, or of its last one once it has none (peaks from the
// attempt's record); empty for a job never launched.
std::vector<RankView> RanksOf(const JobEntry& entry);

// Jobs with an attempt whose ranks are (or may still be) alive, in submission order. A running
// attempt holds its devices until released, so the holders name every such job: a scrape costs the
// devices, not every job ever stored.
std::vector<RunningJob> RunningJobs(const JobTable& table, const DeviceHolders& holders);

// Where rank `rank`'s log of attempt `attempt` (0: the latest) is: NOT_FOUND for an unknown job,
// FAILED_PRECONDITION before its first attempt, INVALID_ARGUMENT for an attempt or rank it never had.
absl::StatusOr<RankLogFile> FindRankLog(const JobTable& table, const std::string& jobs_dir, const std::string& job_id,
                                        int rank, int attempt);

// `devices` as a caller sees them: a device held by a job `visible` rejects shows neither the job
// nor the rank, only Device.held_by_another_user.
std::vector<fitrun::v1::Device> DevicesSeenBy(std::vector<fitrun::v1::Device> devices, const JobTable& table,
                                              const std::function<bool(const fitrun::v1::Job&)>& visible);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_VIEWS_H_
