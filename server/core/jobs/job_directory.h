// A job's directory, <jobs dir>/<job id>: what is in it by name (one directory per attempt with its
// assignment and its ranks' logs, the checkpoints every attempt shares), and reading what its ranks
// left there. The directory is its owner's account's (Job.run_as) from the first attempt on and its
// processes may put anything there: everything here goes through OwnedDirectory, as that account.
//
// Thread-safety: free functions; none takes the job manager's lock, and none should be called under it
// but for names (they read files).
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_DIRECTORY_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_DIRECTORY_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "server/sandbox/owned_directory.h"

namespace fitrun::server {

inline constexpr char kCheckpointsDirectoryName[] = "checkpoints";
inline constexpr char kAssignmentFileName[] = "assignment.textproto";
// "<jobs_dir>/<job_id>".
std::string JobDirectoryPath(const std::string& jobs_dir, const std::string& job_id);
// "attempt-<attempt>".
std::string AttemptDirectoryName(int attempt);
// "attempt-<attempt>/rank-<rank>.log", relative to the job's directory.
std::string RankLogName(int attempt, int rank);

// The job's directory as its account `run_as` (empty: fitrund's own user) works in it; it must exist.
absl::StatusOr<OwnedDirectory> OpenJobDirectory(const std::string& job_dir, const std::string& run_as);

// A rank's log, open for reading: FAILED_PRECONDITION naming what it is when the ranks replaced it
// with anything but a regular file (a symlink, a FIFO).
absl::StatusOr<UntrustedFile> OpenRankLog(const std::string& job_dir, const std::string& run_as, int attempt,
                                          int rank);

// The last lines of a rank's log (at most `max_lines` from its last `max_bytes`), for a failure's
// reason: what a user needs to see first. When the log cannot be read, one line saying why.
std::string RankLogTail(const std::string& job_dir, const std::string& run_as, int attempt, int rank,
                        size_t max_lines = 12, size_t max_bytes = 2048);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_DIRECTORY_H_
