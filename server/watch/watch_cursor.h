// A watcher's position in one job's events, for every kind of stream that follows a job.
#ifndef FITRUN_SERVER_WATCH_WATCH_CURSOR_H_
#define FITRUN_SERVER_WATCH_WATCH_CURSOR_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/jobs/event_hub.h"
#include "server/core/jobs/job_manager.h"

namespace fitrun::server {

// Where one watcher is in a job's events. History older than the hub's in-memory tail is replayed
// from the store, in full; once the watcher has caught up with the tail it follows it, and if it
// then falls behind the tail (the bounded buffer every watcher of the job shares) it is told which
// sequences it missed and goes on from the oldest event still kept, so a slow watcher never makes
// the coordinator read the store on its behalf while ingest writes it. Not thread-safe: each
// stream (a gRPC reactor, a web page's event stream) calls it under its own lock.
class WatchCursor {
 public:
  WatchCursor(JobManager* manager, std::string job_id, int64_t from_sequence)
      : manager_(manager), job_id_(std::move(job_id)), next_(std::max<int64_t>(1, from_sequence)) {}

  // The job has ended with this event: the stream ends once it is sent.
  void EndAt(int64_t last_sequence) { end_ = last_sequence; }
  bool Done() const { return end_.has_value() && next_ > *end_; }

  // Up to `limit` (>= 2) next events, in order; empty when there is nothing new yet.
  absl::StatusOr<std::vector<EventHub::EventRef>> Next(size_t limit);

 private:
  JobManager* const manager_;
  const std::string job_id_;
  int64_t next_;
  bool following_ = false;
  std::optional<int64_t> end_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_WATCH_WATCH_CURSOR_H_
