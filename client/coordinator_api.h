// The coordinator's API as the CLI uses it, with absl::Status errors. The commands depend on this
// interface rather than on the gRPC stub so that tests can drive them with FakeCoordinator.
#ifndef FITRUN_CLIENT_COORDINATOR_API_H_
#define FITRUN_CLIENT_COORDINATOR_API_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/coordinator.pb.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::client {

// Errors keep the coordinator's gRPC status code (absl and gRPC number their codes alike) and its
// message unchanged, so INVALID_ARGUMENT still names the spec field that was wrong.
class CoordinatorApi {
 public:
  using EventCallback = std::function<void(const v1::JobEvent&)>;

  virtual ~CoordinatorApi() = default;

  // Specs travel as the YAML the user wrote: the coordinator parses and validates them, so every
  // client reports the same errors.
  virtual absl::StatusOr<v1::Job> SubmitJob(const std::string& spec_yaml) = 0;
  virtual absl::StatusOr<v1::PlanJobResponse> PlanJob(const std::string& spec_yaml) = 0;
  virtual absl::StatusOr<v1::Job> GetJob(const std::string& job_id) = 0;
  // Jobs in any of `states` (every job when empty), in submission order.
  virtual absl::StatusOr<v1::ListJobsResponse> ListJobs(const std::vector<v1::JobState>& states) = 0;
  virtual absl::StatusOr<v1::Job> CancelJob(const std::string& job_id,
                                            const std::string& reason) = 0;
  virtual absl::StatusOr<v1::ListDevicesResponse> ListDevices() = 0;

  // Calls `on_event` for each of the job's events from `from_sequence` on, on the calling thread,
  // and returns when the stream ends: OK when the coordinator closed it because the job ended,
  // otherwise why it broke. Resuming is a second call from the last sequence seen + 1.
  virtual absl::Status WatchJob(const std::string& job_id, int64_t from_sequence,
                                const EventCallback& on_event) = 0;

  // Calls `on_event` for the job's events from `from_sequence` through `to_sequence` (events the
  // coordinator already has, e.g. up to Job.last_sequence), on the calling thread, then closes the
  // stream: a running job's stream would otherwise wait for events that have not happened yet. OK
  // once `to_sequence` was reached or the coordinator ended the stream; otherwise why it broke.
  virtual absl::Status ReadJobEvents(const std::string& job_id, int64_t from_sequence, int64_t to_sequence,
                                     const EventCallback& on_event) = 0;

  // Calls `on_chunk` with the bytes of a rank's log (latest attempt), on the calling thread; with
  // `follow`, until the attempt ends.
  using LogCallback = std::function<void(const v1::LogChunk&)>;
  virtual absl::Status StreamLogs(const std::string& job_id, int rank, bool follow,
                                  const LogCallback& on_chunk) = 0;
};

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_COORDINATOR_API_H_
