// A scripted CoordinatorApi for tests: each method returns the reply the test set and records the
// request, so a test can run a command and check both what it sent and what it printed.
#ifndef FITRUN_CLIENT_FAKE_COORDINATOR_H_
#define FITRUN_CLIENT_FAKE_COORDINATOR_H_

#include <cstdint>
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
  absl::StatusOr<v1::ListJobsResponse> ListJobs() override {
    ++list_jobs_calls;
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
    watches.emplace_back(job_id, from_sequence);
    for (const v1::JobEvent& event : watch_events) {
      if (event.sequence() >= from_sequence) on_event(event);
    }
    return watch_end;
  }
};

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_FAKE_COORDINATOR_H_
