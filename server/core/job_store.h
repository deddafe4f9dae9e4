// Where the coordinator keeps jobs and their events so that nothing accepted is lost.
// Implemented over SQLite in server/store; tests use an in-memory fake.
#ifndef FITRUN_SERVER_CORE_JOB_STORE_H_
#define FITRUN_SERVER_CORE_JOB_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

// A job as stored: the public Job plus what only the coordinator may see.
struct JobRecord {
  fitrun::v1::Job job;
  // The per-job secret workers present in their Hello.
  std::string token;
  // Submission order, for the scheduler's tie-break and for stable listings.
  int64_t submit_order = 0;
};

// Implementations are thread-safe.
class JobStore {
 public:
  virtual ~JobStore() = default;
  // Inserts or replaces the job (keyed by job.id). Durable when it returns OK.
  virtual absl::Status PutJob(const JobRecord& record) = 0;
  // Appends one event (keyed by job id and sequence); a sequence stored before is an error, never
  // an overwrite.
  virtual absl::Status AppendEvent(const fitrun::v1::JobEvent& event) = 0;
  // Appends several events, all or none (one transaction: a group commit, so a burst of events
  // costs one commit rather than one each). Same rules as AppendEvent for each.
  virtual absl::Status AppendEvents(absl::Span<const fitrun::v1::JobEvent> events) = 0;
  // Appends the job's events and stores the job, all or none (one commit for a state change and
  // the job it changes, rather than two).
  virtual absl::Status AppendEventsAndPutJob(absl::Span<const fitrun::v1::JobEvent> events,
                                             const JobRecord& record) = 0;
  virtual absl::StatusOr<std::vector<JobRecord>> LoadJobs() = 0;
  // The highest event sequence stored for the job (0 when none): where numbering resumes.
  virtual absl::StatusOr<int64_t> LastEventSequence(const std::string& job_id) = 0;
  // Up to `limit` events of the job with sequence >= from_sequence, in order.
  virtual absl::StatusOr<std::vector<fitrun::v1::JobEvent>> ReadEvents(const std::string& job_id,
                                                                        int64_t from_sequence, int limit) = 0;
  // Removes the jobs, their events and their attempts, all or none (the operator's retention:
  // server/core/jobs/retention.h).
  virtual absl::Status DeleteJobs(absl::Span<const std::string> job_ids) = 0;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOB_STORE_H_
