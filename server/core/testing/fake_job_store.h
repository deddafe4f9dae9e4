// A JobStore in memory: keeps jobs and events as the SQLite store would (an event stored twice is refused,
// a batch is all or none), counts the batches, and lets a test make every put fail (FailPuts).
// Thread-safe: the manager's threads and the test call it at once.
#ifndef FITRUN_SERVER_CORE_TESTING_FAKE_JOB_STORE_H_
#define FITRUN_SERVER_CORE_TESTING_FAKE_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/core/job_store.h"

namespace fitrun::server {

class FakeJobStore : public JobStore {
 public:
  absl::Status PutJob(const JobRecord& record) override {
    absl::MutexLock lock(&mu_);
    if (!put_status_.ok()) return put_status_;
    jobs_[record.job.id()] = record;
    return absl::OkStatus();
  }
  absl::Status AppendEvent(const fitrun::v1::JobEvent& event) override {
    absl::MutexLock lock(&mu_);
    if (!events_[event.job_id()].emplace(event.sequence(), event).second) {
      return absl::AlreadyExistsError("event sequence stored twice");
    }
    return absl::OkStatus();
  }
  absl::Status AppendEvents(absl::Span<const fitrun::v1::JobEvent> events) override {
    absl::MutexLock lock(&mu_);
    ++append_batches_;
    for (const fitrun::v1::JobEvent& event : events) {
      if (events_[event.job_id()].count(event.sequence()) > 0) {
        return absl::AlreadyExistsError("event sequence stored twice");  // before storing any
      }
    }
    for (const fitrun::v1::JobEvent& event : events) events_[event.job_id()].emplace(event.sequence(), event);
    return absl::OkStatus();
  }
  absl::Status AppendEventsAndPutJob(absl::Span<const fitrun::v1::JobEvent> events,
                                     const JobRecord& record) override {
    {
      absl::MutexLock lock(&mu_);
      if (!put_status_.ok()) return put_status_;  // all or none
    }
    if (absl::Status status = AppendEvents(events); !status.ok()) return status;
    return PutJob(record);
  }
  // How many AppendEvents calls there were (each one transaction in a real store).
  int append_batches() {
    absl::MutexLock lock(&mu_);
    return append_batches_;
  }
  absl::StatusOr<std::vector<JobRecord>> LoadJobs() override {
    absl::MutexLock lock(&mu_);
    std::vector<JobRecord> out;
    for (const auto& [id, record] : jobs_) out.push_back(record);
    return out;
  }
  absl::StatusOr<int64_t> LastEventSequence(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(job_id);
    return it == events_.end() || it->second.empty() ? 0 : it->second.rbegin()->first;
  }
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                                int limit) override {
    absl::MutexLock lock(&mu_);
    std::vector<fitrun::v1::JobEvent> out;
    for (auto it = events_[job_id].lower_bound(from_sequence); it != events_[job_id].end() && static_cast<int>(out.size()) < limit; ++it) {
      out.push_back(it->second);
    }
    return out;
  }
  absl::Status DeleteJobs(absl::Span<const std::string> job_ids) override {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : job_ids) {
      jobs_.erase(id);
      events_.erase(id);
    }
    return absl::OkStatus();
  }
  size_t event_count(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(job_id);
    return it == events_.end() ? 0 : it->second.size();
  }
  void FailPuts(absl::Status status) {
    absl::MutexLock lock(&mu_);
    put_status_ = std::move(status);
  }
  size_t job_count() {
    absl::MutexLock lock(&mu_);
    return jobs_.size();
  }

 private:
  absl::Mutex mu_;
  absl::Status put_status_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<int64_t, fitrun::v1::JobEvent>> events_ ABSL_GUARDED_BY(mu_);
  int append_batches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_TESTING_FAKE_JOB_STORE_H_
