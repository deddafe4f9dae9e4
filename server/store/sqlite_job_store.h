// JobStore over one SQLite database in WAL mode: jobs and their events, as serialized protos beside
// the columns queries need. The schema is versioned (PRAGMA user_version) and migrated forward on
// open; a database written by a newer fitrund is refused rather than misread.
//
// Thread-safe: one connection, serialized by a mutex (SQLite's writes are serialized anyway).
//
// Checkpoints (copying the WAL back into the database, with its fsyncs) run on a thread and a
// connection of their own, so no commit on the ingest path ever waits for one: left to SQLite, the
// commit that fills the WAL to 1,000 pages runs the checkpoint itself, a stall of several
// milliseconds under the coordinator's lock every few seconds of heavy event traffic. Commits only
// tell that thread when the WAL has reached that size; only a burst that outruns the thread by far
// (kCommitCheckpointFrames) makes a commit checkpoint itself.
#ifndef FITRUN_SERVER_STORE_SQLITE_JOB_STORE_H_
#define FITRUN_SERVER_STORE_SQLITE_JOB_STORE_H_

#include <memory>
#include <string>
#include <thread>
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

  // WAL pages after which a commit asks for a checkpoint (SQLite's own default threshold).
  static constexpr int kCheckpointFrames = 1000;
  // WAL pages past which the checkpoint thread makes the writer start the WAL afresh.
  static constexpr int kRestartFrames = 8 * kCheckpointFrames;
  // WAL pages past which a commit checkpoints itself: the bound on the WAL when commits come faster
  // than the checkpoint thread copies them.
  static constexpr int kCommitCheckpointFrames = 32 * kCheckpointFrames;

  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& path);
  ~SqliteJobStore() override;

  absl::Status PutJob(const JobRecord& record) override;
  absl::Status AppendEvent(const fitrun::v1::JobEvent& event) override;
  absl::Status AppendEvents(absl::Span<const fitrun::v1::JobEvent> events) override;
  absl::Status AppendEventsAndPutJob(absl::Span<const fitrun::v1::JobEvent> events, const JobRecord& record) override;
  absl::StatusOr<std::vector<JobRecord>> LoadJobs() override;
  absl::StatusOr<int64_t> LastEventSequence(const std::string& job_id) override;
  absl::StatusOr<std::vector<fitrun::v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t from_sequence,
                                                                int limit) override;
  // The pages they held are reused by later writes (the file does not shrink, nor grow while the
  // rows deleted make room for the rows added).
  absl::Status DeleteJobs(absl::Span<const std::string> job_ids) override;
  // Checkpoint passes run so far (for tests).
  int64_t checkpoints();

 private:
  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  // Starts the checkpoint thread on its own connection to `path`.
  absl::Status StartCheckpointer(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckpointLoop();
  // sqlite3_wal_hook: runs after each commit, with the WAL's size in pages.
  static int OnWalCommit(void* self, sqlite3* db, const char* name, int wal_frames);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One insert through the prepared statement, inside whatever transaction is open.
  absl::Status InsertEvent(const fitrun::v1::JobEvent& event, std::string* scratch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UpsertJob(const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  // Events are the hot path: their insert is prepared once.
  sqlite3_stmt* append_event_ ABSL_GUARDED_BY(mu_) = nullptr;

  // The checkpoint thread's connection and its stop signal.
  sqlite3* checkpoint_db_ = nullptr;
  // Held through each checkpoint, so that one a commit must run waits for the thread's to end.
  absl::Mutex pass_mu_;
  absl::Mutex checkpoint_mu_;
  bool stopping_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  bool checkpoint_requested_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  int64_t checkpoints_ ABSL_GUARDED_BY(checkpoint_mu_) = 0;
  std::thread checkpointer_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_STORE_SQLITE_JOB_STORE_H_
