// JobStore over one SQLite database in WAL mode: jobs and their events, as serialized protos beside
// the columns queries need. The schema is versioned (PRAGMA user_version) and migrated forward on
// open; a database written by a newer fitrund is refused rather than misread.
//
// Thread-safe: one connection, serialized by a mutex (SQLite's writes are serialized anyway).
#ifndef FITRUN_SERVER_STORE_SQLITE_JOB_STORE_H_
#define FITRUN_SERVER_STORE_SQLITE_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/job_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace fitrun::server {

class SqliteJobStore : public JobStore {
 public:
  // The schema version this build writes.
  static constexpr int kSchemaVersion = 2;

  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& path);
  ~SqliteJobStore() override;

  absl::Status PutJob(const JobRecord& record) override;
  absl::Status AppendEvent(const fitrun::v1::JobEvent& event) override;
  absl::Status AppendEvents(absl::Span<const fitrun::v1::JobEvent> events) override;
  absl::StatusOr<std::vector<JobRecord>> LoadJobs() override;
  absl::StatusOr<int64_t> LastEventSequence(const std::string& job_id) override;
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                                int limit) override;

 private:
  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One insert through the prepared statement, inside whatever transaction is open.
  absl::Status InsertEvent(const fitrun::v1::JobEvent& event, std::string* scratch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  // Events are the hot path: their insert is prepared once.
  sqlite3_stmt* append_event_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_STORE_SQLITE_JOB_STORE_H_
