// A scripted CoordinatorApi for tests: each method returns the reply the test set and records the
// request, so a test can run a command and check both what it sent and what it printed.
#ifndef FITRUN_CLIENT_FAKE_COORDINATOR_H_
#define FITRUN_CLIENT_FAKE_COORDINATOR_H_

#include <cstdint>
#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "client/coordinator_api.h"

namespace fitrun::client {

class FakeCoordinator : public CoordinatorApi {
 public:
  // Replies. Unset ones fail loudly so a test notices a call it did not expect.
  absl::StatusOr<v1::Job> submit_reply = absl::UnimplementedError("FakeCoordinator: SubmitJob");
  absl::StatusOr<v1::PlanJobResponse> plan_reply =
      absl::UnimplementedError("FakeCoordinator: PlanJob");
  absl::StatusOr<v1::Job> get_reply = absl::UnimplementedError("FakeCoordinator: GetJob");
  absl::StatusOr<v1::ListJobsResponse> list_reply =
      absl::UnimplementedError("FakeCoordinator: ListJobs");
  absl::StatusOr<v1::Job> cancel_reply = absl::UnimplementedError("FakeCoordinator: CancelJob");
  absl::StatusOr<v1::ListDevicesResponse> devices_reply =
      absl::UnimplementedError("FakeCoordinator: ListDevices");
  // WatchJob delivers the events at or after from_sequence, then ends with watch_end.
  std::vector<v1::JobEvent> watch_events;
  absl::Status watch_end = absl::OkStatus();
  // Later WatchJob calls end with these instead of watch_end, first to last (a coordinator that
  // went away and came back); when exhausted, watch_end again.
  std::vector<absl::Status> watch_ends_then;
  // StreamLogs delivers these chunks, then ends with logs_end.
  std::vector<v1::LogChunk> log_chunks;
  absl::Status logs_end = absl::OkStatus();
  std::vector<v1::JobState> listed_states;
  std::vector<std::pair<std::string, int>> logs_requested;  // (job id, rank)

  // Requests, in call order.
  std::vector<std::string> submitted_specs;
  std::vector<std::string> planned_specs;
  std::vector<std::string> got_job_ids;
  std::vector<std::pair<std::string, std::string>> cancelled;  // (job id, reason)
  std::vector<std::pair<std::string, int64_t>> watches;        // (job id, from_sequence)
  int list_jobs_calls = 0;
  int list_devices_calls = 0;

  absl::StatusOr<v1::Job> SubmitJob(const std::string& spec_yaml) override {
    submitted_specs.push_back(spec_yaml);
    return submit_reply;
  }
  absl::StatusOr<v1::PlanJobResponse> PlanJob(const std::string& spec_yaml) override {
    planned_specs.push_back(spec_yaml);
    return plan_reply;
  }
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) override {
    got_job_ids.push_back(job_id);
    return get_reply;
  }
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const std::vector<v1::JobState>& states) override {
    ++list_jobs_calls;
    listed_states = states;
    return list_reply;
  }
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id,
                                    const std::string& reason) override {
    cancelled.emplace_back(job_id, reason);
    return cancel_reply;
  }
  absl::StatusOr<v1::ListDevicesResponse> ListDevices() override {
    ++list_devices_calls;
    return devices_reply;
  }
  absl::Status WatchJob(const std::string& job_id, int64_t from_sequence,
                        const EventCallback& on_event) override {
    const bool first_call = watches.empty();
    watches.emplace_back(job_id, from_sequence);
    // A broken first stream delivers only part of the events; a later one delivers the rest.
    const size_t calls = watches.size();
    absl::Status end = watch_end;
    if (!first_call && calls - 2 < watch_ends_then.size()) end = watch_ends_then[calls - 2];
    // A later call that fails could not connect: it delivers nothing.
    if (!first_call && !end.ok()) return end;
    for (const v1::JobEvent& event : watch_events) {
      if (event.sequence() < from_sequence) continue;
      if (first_call && !watch_end.ok() && event.sequence() > break_after_sequence) break;
      on_event(event);
    }
    return first_call ? watch_end : end;
  }
  // With a failing watch_end, the first stream stops after this sequence.
  int64_t break_after_sequence = INT64_MAX;

  // ReadJobEvents delivers the watch_events in [from, to], then ends with read_events_end.
  absl::Status read_events_end = absl::OkStatus();
  struct EventRead {
    std::string job_id;
    int64_t from_sequence;
    int64_t to_sequence;
  };
  std::vector<EventRead> event_reads;

  absl::Status ReadJobEvents(const std::string& job_id, int64_t from_sequence, int64_t to_sequence,
                             const EventCallback& on_event) override {
    event_reads.push_back({job_id, from_sequence, to_sequence});
    for (const v1::JobEvent& event : watch_events) {
      if (event.sequence() >= from_sequence && event.sequence() <= to_sequence) on_event(event);
    }
    return read_events_end;
  }

  absl::Status StreamLogs(const std::string& job_id, int rank, bool,
                          const LogCallback& on_chunk) override {
    logs_requested.emplace_back(job_id, rank);
    for (const v1::LogChunk& chunk : log_chunks) on_chunk(chunk);
    return logs_end;
  }
};

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_FAKE_COORDINATOR_H_
