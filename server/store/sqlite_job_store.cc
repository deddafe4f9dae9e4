#include "server/store/sqlite_job_store.h"

#include <sqlite3.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "proto/contract/log.h"

namespace fitrun::server {
namespace {

// Each entry moves the schema from version i to i + 1.
const char* const kMigrations[] = {
    // 0 -> 1
    "CREATE TABLE jobs ("
    "  id TEXT PRIMARY KEY,"
    "  submit_order INTEGER NOT NULL,"
    "  state INTEGER NOT NULL,"
    "  token TEXT NOT NULL,"
    "  job BLOB NOT NULL);"
    "CREATE TABLE events ("
    "  job_id TEXT NOT NULL,"
    "  sequence INTEGER NOT NULL,"
    "  event BLOB NOT NULL,"
    "  PRIMARY KEY (job_id, sequence)) WITHOUT ROWID;",
    // 1 -> 2: every launch of a job, queryable without decoding the job.
    "CREATE TABLE attempts ("
    "  job_id TEXT NOT NULL,"
    "  attempt INTEGER NOT NULL,"
    "  outcome TEXT NOT NULL,"
    "  record BLOB NOT NULL,"
    "  PRIMARY KEY (job_id, attempt)) WITHOUT ROWID;",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == SqliteJobStore::kSchemaVersion);

// A prepared statement that finalizes itself.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void BindText(int i, const std::string& s) { sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT); }
  void BindBlob(int i, const std::string& s) { sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT); }
  void BindInt(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  std::string ColumnBlob(int i) {
    const void* data = sqlite3_column_blob(stmt_, i);
    return std::string(static_cast<const char*>(data), static_cast<size_t>(sqlite3_column_bytes(stmt_, i)));
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

absl::Status SqliteError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat("sqlite: ", what, ": ", sqlite3_errmsg(db)));
}

// One checkpoint of `mode` (SQLITE_CHECKPOINT_*) on `db`; returns the WAL's size in pages. BUSY
// (another checkpoint is running) is not worth a word.
int Checkpoint(sqlite3* db, int mode) {
  int wal_frames = 0;
  int copied = 0;
  if (sqlite3_wal_checkpoint_v2(db, nullptr, mode, &wal_frames, &copied) != SQLITE_OK &&
      sqlite3_errcode(db) != SQLITE_BUSY) {
    contract::LogWarning("checkpointing the job store: %s", sqlite3_errmsg(db));
  }
  return wal_frames;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status status = absl::FailedPreconditionError(
        absl::StrCat("cannot open the job store ", path, ": ", db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return status;
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db));
  absl::MutexLock lock(&store->mu_);
  // WAL: readers never block the writer; synchronous=NORMAL is durable across process crashes
  // (what a SIGKILLed coordinator needs) without an fsync per event. Commits never checkpoint: the
  // checkpoint thread does (see the header). A WAL file grown past 64 MiB (a burst) is cut back
  // when it starts afresh.
  if (absl::Status status =
          store->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0; "
                      "PRAGMA journal_size_limit=67108864;");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = store->Migrate(); !status.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", status.message()));
  }
  if (sqlite3_prepare_v2(store->db_, "INSERT INTO events (job_id, sequence, event) VALUES (?1, ?2, ?3);", -1,
                         &store->append_event_, nullptr) != SQLITE_OK) {
    return SqliteError(store->db_, "preparing the event insert");
  }
  if (absl::Status status = store->StartCheckpointer(path); !status.ok()) return status;
  return store;
}

absl::Status SqliteJobStore::StartCheckpointer(const std::string& path) {
  if (sqlite3_open_v2(path.c_str(), &checkpoint_db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open the job store ", path, " for checkpoints: ",
                                                      checkpoint_db_ ? sqlite3_errmsg(checkpoint_db_) : "out of memory"));
  }
  sqlite3_busy_timeout(checkpoint_db_, 5000);
  // A connection learns that the database is in WAL mode when it first reads it; until then its
  // checkpoints do nothing.
  if (sqlite3_exec(checkpoint_db_, "SELECT count(*) FROM sqlite_master;", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqliteError(checkpoint_db_, "reading the job store for checkpoints");
  }
  checkpointer_ = std::thread([this] { CheckpointLoop(); });
  sqlite3_wal_hook(db_, &SqliteJobStore::OnWalCommit, this);
  return absl::OkStatus();
}

void SqliteJobStore::CheckpointLoop() {
  // A PASSIVE checkpoint copies what no reader still needs and never blocks the writer. It runs when
  // a commit has grown the WAL to kCheckpointFrames (the size at which SQLite would checkpoint
  // inside that commit), and after a quiet spell so that an idle WAL is folded in too. Passes are
  // at least kSpacing apart: under steady ingest the writer keeps appending while a pass copies, so
  // every commit finds the WAL still long and asks again, and unspaced passes would fsync the WAL
  // continuously (about 1,000 times a second at 10,000 events/s) for a few frames each.
  constexpr absl::Duration kIdleInterval = absl::Seconds(5);
  constexpr absl::Duration kSpacing = absl::Milliseconds(100);
  absl::MutexLock lock(&checkpoint_mu_);
  while (!stopping_) {
    auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) { return stopping_ || checkpoint_requested_; };
    checkpoint_mu_.AwaitWithTimeout(absl::Condition(&due), kIdleInterval);
    if (stopping_) break;
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) { return stopping_; };
    if (checkpoint_mu_.AwaitWithTimeout(absl::Condition(&stopping), kSpacing)) break;
    checkpoint_requested_ = false;
    checkpoint_mu_.Unlock();
    {
      absl::MutexLock pass(&pass_mu_);
      const int wal_frames = Checkpoint(checkpoint_db_, SQLITE_CHECKPOINT_PASSIVE);
      // The writer starts the WAL afresh only when it finds every frame copied, which never happens
      // while it commits faster than a pass copies: past kRestartFrames a RESTART checkpoint makes it
      // wait for the last frames (the passive pass has just copied the rest), a few milliseconds, so
      // the WAL stays bounded.
      if (wal_frames >= kRestartFrames) Checkpoint(checkpoint_db_, SQLITE_CHECKPOINT_RESTART);
    }
    checkpoint_mu_.Lock();
    ++checkpoints_;
  }
}

int SqliteJobStore::OnWalCommit(void* self, sqlite3* db, const char*, int wal_frames) {
  auto* store = static_cast<SqliteJobStore*>(self);
  if (wal_frames >= kCommitCheckpointFrames) {
    // Commits outrun the checkpoint thread (a burst far beyond any job's reports): this commit
    // copies the WAL and has it start afresh, which also holds the writer back until it is done.
    // It waits for a pass of the thread to end first: SQLite refuses a second checkpointer at once
    // rather than waiting. (The hook runs after the commit has released SQLite's locks.)
    absl::MutexLock pass(&store->pass_mu_);
    Checkpoint(db, SQLITE_CHECKPOINT_RESTART);
    return SQLITE_OK;
  }
  if (wal_frames >= kCheckpointFrames) {
    absl::MutexLock lock(&store->checkpoint_mu_);
    store->checkpoint_requested_ = true;
  }
  return SQLITE_OK;
}

int64_t SqliteJobStore::checkpoints() {
  absl::MutexLock lock(&checkpoint_mu_);
  return checkpoints_;
}

SqliteJobStore::~SqliteJobStore() {
  {
    absl::MutexLock lock(&checkpoint_mu_);
    stopping_ = true;
  }
  if (checkpointer_.joinable()) checkpointer_.join();
  sqlite3_close(checkpoint_db_);
  absl::MutexLock lock(&mu_);
  sqlite3_finalize(append_event_);
  sqlite3_close(db_);
}

absl::Status SqliteJobStore::Exec(const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status status = absl::InternalError(absl::StrCat("sqlite: ", error ? error : "unknown error"));
    sqlite3_free(error);
    return status;
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::Migrate() {
  Statement version_query(db_, "PRAGMA user_version;");
  if (!version_query.ok() || sqlite3_step(version_query.get()) != SQLITE_ROW) {
    return SqliteError(db_, "reading the schema version");
  }
  const int version = sqlite3_column_int(version_query.get(), 0);
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job store has schema version ", version, " but this fitrund understands up to ", kSchemaVersion,
        "; run a newer fitrund, or point --state_dir at another directory"));
  }
  for (int v = version; v < kSchemaVersion; ++v) {
    const std::string sql = absl::StrCat("BEGIN;", kMigrations[v], "PRAGMA user_version=", v + 1, ";COMMIT;");
    if (absl::Status status = Exec(sql.c_str()); !status.ok()) {
      (void)Exec("ROLLBACK;");
      return absl::InternalError(absl::StrCat("migrating the schema to version ", v + 1, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::PutJob(const JobRecord& record) {
  absl::MutexLock lock(&mu_);
  // Two statements when an attempt changes: one transaction.
  if (record.job.attempt_history().empty()) return UpsertJob(record);
  if (absl::Status status = Exec("BEGIN IMMEDIATE;"); !status.ok()) return status;
  if (absl::Status status = UpsertJob(record); !status.ok()) {
    (void)Exec("ROLLBACK;");
    return status;
  }
  return Exec("COMMIT;");
}

absl::Status SqliteJobStore::AppendEventsAndPutJob(absl::Span<const fitrun::v1::JobEvent> events,
                                                   const JobRecord& record) {
  std::string blob;
  absl::MutexLock lock(&mu_);
  if (absl::Status status = Exec("BEGIN IMMEDIATE;"); !status.ok()) return status;
  for (const fitrun::v1::JobEvent& event : events) {
    if (absl::Status status = InsertEvent(event, &blob); !status.ok()) {
      (void)Exec("ROLLBACK;");
      return status;
    }
  }
  if (absl::Status status = UpsertJob(record); !status.ok()) {
    (void)Exec("ROLLBACK;");
    return status;
  }
  return Exec("COMMIT;");
}

absl::Status SqliteJobStore::UpsertJob(const JobRecord& record) {
  Statement insert(db_,
                   "INSERT INTO jobs (id, submit_order, state, token, job) VALUES (?1, ?2, ?3, ?4, ?5) "
                   "ON CONFLICT(id) DO UPDATE SET state = excluded.state, job = excluded.job;");
  if (!insert.ok()) return SqliteError(db_, "preparing PutJob");
  insert.BindText(1, record.job.id());
  insert.BindInt(2, record.submit_order);
  insert.BindInt(3, record.job.state());
  insert.BindText(4, record.token);
  insert.BindBlob(5, record.job.SerializeAsString());
  if (sqlite3_step(insert.get()) != SQLITE_DONE) return SqliteError(db_, "storing a job");
  // Only the newest attempt changes; older ones were written when they ended.
  if (!record.job.attempt_history().empty()) {
    const fitrun::v1::AttemptRecord& attempt = record.job.attempt_history(record.job.attempt_history_size() - 1);
    Statement upsert(db_,
                     "INSERT INTO attempts (job_id, attempt, outcome, record) VALUES (?1, ?2, ?3, ?4) "
                     "ON CONFLICT(job_id, attempt) DO UPDATE SET outcome = excluded.outcome, record = excluded.record;");
    if (!upsert.ok()) return SqliteError(db_, "preparing the attempt upsert");
    upsert.BindText(1, record.job.id());
    upsert.BindInt(2, attempt.attempt());
    upsert.BindText(3, attempt.outcome());
    upsert.BindBlob(4, attempt.SerializeAsString());
    if (sqlite3_step(upsert.get()) != SQLITE_DONE) return SqliteError(db_, "storing an attempt");
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::InsertEvent(const fitrun::v1::JobEvent& event, std::string* scratch) {
  scratch->clear();
  event.SerializeToString(scratch);
  sqlite3_reset(append_event_);
  sqlite3_bind_text(append_event_, 1, event.job_id().data(), static_cast<int>(event.job_id().size()), SQLITE_STATIC);
  sqlite3_bind_int64(append_event_, 2, event.sequence());
  sqlite3_bind_blob(append_event_, 3, scratch->data(), static_cast<int>(scratch->size()), SQLITE_STATIC);
  const int rc = sqlite3_step(append_event_);
  sqlite3_reset(append_event_);
  sqlite3_clear_bindings(append_event_);
  if (rc != SQLITE_DONE) return SqliteError(db_, "storing an event");
  return absl::OkStatus();
}

absl::Status SqliteJobStore::AppendEvent(const fitrun::v1::JobEvent& event) {
  std::string blob;
  absl::MutexLock lock(&mu_);
  return InsertEvent(event, &blob);
}

absl::Status SqliteJobStore::AppendEvents(absl::Span<const fitrun::v1::JobEvent> events) {
  if (events.empty()) return absl::OkStatus();
  std::string blob;
  absl::MutexLock lock(&mu_);
  if (events.size() == 1) return InsertEvent(events[0], &blob);  // autocommit is one transaction already
  // One commit (one WAL append and sync point) for the whole batch.
  if (absl::Status status = Exec("BEGIN IMMEDIATE;"); !status.ok()) return status;
  for (const fitrun::v1::JobEvent& event : events) {
    if (absl::Status status = InsertEvent(event, &blob); !status.ok()) {
      (void)Exec("ROLLBACK;");
      return status;
    }
  }
  return Exec("COMMIT;");
}

absl::StatusOr<std::vector<JobRecord>> SqliteJobStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  Statement query(db_, "SELECT submit_order, token, job FROM jobs ORDER BY submit_order;");
  if (!query.ok()) return SqliteError(db_, "preparing LoadJobs");
  std::vector<JobRecord> records;
  int rc;
  while ((rc = sqlite3_step(query.get())) == SQLITE_ROW) {
    JobRecord record;
    record.submit_order = sqlite3_column_int64(query.get(), 0);
    record.token = reinterpret_cast<const char*>(sqlite3_column_text(query.get(), 1));
    if (!record.job.ParseFromString(query.ColumnBlob(2))) {
      return absl::DataLossError(absl::StrCat("job row ", record.submit_order, " does not parse"));
    }
    records.push_back(std::move(record));
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "loading jobs");
  return records;
}

absl::Status SqliteJobStore::DeleteJobs(absl::Span<const std::string> job_ids) {
  if (job_ids.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (absl::Status status = Exec("BEGIN IMMEDIATE;"); !status.ok()) return status;
  for (const char* sql : {"DELETE FROM events WHERE job_id = ?1;", "DELETE FROM attempts WHERE job_id = ?1;",
                          "DELETE FROM jobs WHERE id = ?1;"}) {
    Statement remove(db_, sql);
    if (!remove.ok()) {
      const absl::Status error = SqliteError(db_, "preparing DeleteJobs");
      (void)Exec("ROLLBACK;");
      return error;
    }
    for (const std::string& id : job_ids) {
      sqlite3_reset(remove.get());
      remove.BindText(1, id);
      if (sqlite3_step(remove.get()) != SQLITE_DONE) {
        const absl::Status error = SqliteError(db_, "deleting a job");
        (void)Exec("ROLLBACK;");
        return error;
      }
    }
  }
  return Exec("COMMIT;");
}

absl::StatusOr<int64_t> SqliteJobStore::LastEventSequence(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement query(db_, "SELECT COALESCE(MAX(sequence), 0) FROM events WHERE job_id = ?1;");
  if (!query.ok()) return SqliteError(db_, "preparing LastEventSequence");
  query.BindText(1, job_id);
  if (sqlite3_step(query.get()) != SQLITE_ROW) return SqliteError(db_, "reading the last event");
  return static_cast<int64_t>(sqlite3_column_int64(query.get(), 0));
}

absl::StatusOr<std::vector<fitrun::v1::JobEvent>> SqliteJobStore::ReadEvents(const std::string& job_id,
                                                                              int64_t from_sequence, int limit) {
  absl::MutexLock lock(&mu_);
  Statement query(db_, "SELECT event FROM events WHERE job_id = ?1 AND sequence >= ?2 ORDER BY sequence LIMIT ?3;");
  if (!query.ok()) return SqliteError(db_, "preparing ReadEvents");
  query.BindText(1, job_id);
  query.BindInt(2, from_sequence);
  query.BindInt(3, limit);
  std::vector<fitrun::v1::JobEvent> events;
  int rc;
  while ((rc = sqlite3_step(query.get())) == SQLITE_ROW) {
    fitrun::v1::JobEvent event;
    if (!event.ParseFromString(query.ColumnBlob(0))) {
      return absl::DataLossError(absl::StrCat("event ", job_id, " does not parse"));
    }
    events.push_back(std::move(event));
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "reading events");
  return events;
}

}  // namespace fitrun::server
