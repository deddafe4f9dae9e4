#include "server/store/sqlite_job_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

std::string FreshDb(const std::string& name) {
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) / (name + ".db");
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix);
  return path.string();
}

// What a COUNT(*) query finds in the database at `path`, read directly (-1 and a test failure when
// the query cannot run).
int CountRows(const std::string& path, const char* count_query) {
  sqlite3* db = nullptr;
  int count = -1;
  sqlite3_stmt* query = nullptr;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK &&
      sqlite3_prepare_v2(db, count_query, -1, &query, nullptr) == SQLITE_OK && sqlite3_step(query) == SQLITE_ROW) {
    count = sqlite3_column_int(query, 0);
  }
  EXPECT_GE(count, 0) << count_query << ": " << sqlite3_errmsg(db);
  sqlite3_finalize(query);
  sqlite3_close(db);
  return count;
}

JobRecord Record(const std::string& id, int64_t order, fitrun::v1::JobState state) {
  JobRecord record;
  record.job.set_id(id);
  record.job.set_state(state);
  record.job.mutable_spec()->set_name("n-" + id);
  record.token = "token-" + id;
  record.submit_order = order;
  return record;
}

TEST(SqliteJobStoreTest, JobsSurviveReopeningInSubmissionOrder) {
  const std::string path = FreshDb("reopen");
  {
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutJob(Record("b", 2, fitrun::v1::JOB_STATE_QUEUED)).ok());
    ASSERT_TRUE((*store)->PutJob(Record("a", 1, fitrun::v1::JOB_STATE_QUEUED)).ok());
    ASSERT_TRUE((*store)->PutJob(Record("a", 1, fitrun::v1::JOB_STATE_SUCCEEDED)).ok());  // update
  }
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job.id(), "a");
  EXPECT_EQ((*jobs)[0].job.state(), fitrun::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ((*jobs)[0].token, "token-a");
  EXPECT_EQ((*jobs)[1].job.spec().name(), "n-b");
}

TEST(SqliteJobStoreTest, EventsReadBackFromAnySequenceWithALimit) {
  auto store = SqliteJobStore::Open(FreshDb("events"));
  ASSERT_TRUE(store.ok());
  for (int i = 1; i <= 20; ++i) {
    fitrun::v1::JobEvent event;
    event.set_job_id(i % 2 ? "odd" : "even");
    event.set_sequence(i);
    event.mutable_log()->set_text(std::to_string(i));
    ASSERT_TRUE((*store)->AppendEvent(event).ok());
  }
  EXPECT_EQ(*(*store)->LastEventSequence("odd"), 19);
  EXPECT_EQ(*(*store)->LastEventSequence("none"), 0);
  // A sequence is never stored twice.
  fitrun::v1::JobEvent again;
  again.set_job_id("odd");
  again.set_sequence(5);
  EXPECT_FALSE((*store)->AppendEvent(again).ok());
  auto events = (*store)->ReadEvents("odd", 5, 3);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].sequence(), 5);
  EXPECT_EQ((*events)[2].log().text(), "9");
}

TEST(SqliteJobStoreTest, AppendEventsStoresABatchAllOrNothing) {
  auto store = SqliteJobStore::Open(FreshDb("batch"));
  ASSERT_TRUE(store.ok());
  std::vector<fitrun::v1::JobEvent> batch;
  for (int i = 1; i <= 100; ++i) {
    fitrun::v1::JobEvent& event = batch.emplace_back();
    event.set_job_id("j");
    event.set_sequence(i);
    event.mutable_log()->set_text(std::to_string(i));
  }
  ASSERT_TRUE((*store)->AppendEvents(batch).ok());
  EXPECT_EQ(*(*store)->LastEventSequence("j"), 100);
  auto events = (*store)->ReadEvents("j", 1, 1000);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 100u);
  EXPECT_EQ((*events)[99].log().text(), "100");
  // A batch with one sequence already stored leaves nothing of itself behind.
  std::vector<fitrun::v1::JobEvent> clash(2);
  clash[0].set_job_id("j");
  clash[0].set_sequence(101);
  clash[1].set_job_id("j");
  clash[1].set_sequence(50);
  EXPECT_FALSE((*store)->AppendEvents(clash).ok());
  EXPECT_EQ(*(*store)->LastEventSequence("j"), 100);
  // The store still takes batches after a rolled-back one, and an empty batch is fine.
  clash.pop_back();
  EXPECT_TRUE((*store)->AppendEvents(clash).ok());
  EXPECT_TRUE((*store)->AppendEvents({}).ok());
  EXPECT_EQ(*(*store)->LastEventSequence("j"), 101);
}

TEST(SqliteJobStoreTest, EventsAndTheirJobAreStoredInOneTransaction) {
  auto store = SqliteJobStore::Open(FreshDb("events-and-job"));
  ASSERT_TRUE(store.ok());
  std::vector<fitrun::v1::JobEvent> events(1);
  events[0].set_job_id("j");
  events[0].set_sequence(1);
  ASSERT_TRUE((*store)->AppendEventsAndPutJob(events, Record("j", 1, fitrun::v1::JOB_STATE_QUEUED)).ok());
  EXPECT_EQ(*(*store)->LastEventSequence("j"), 1);
  ASSERT_EQ((*store)->LoadJobs()->size(), 1u);
  // An event that clashes leaves the job as it was.
  EXPECT_FALSE((*store)->AppendEventsAndPutJob(events, Record("j", 1, fitrun::v1::JOB_STATE_RUNNING)).ok());
  EXPECT_EQ((*store)->LoadJobs()->front().job.state(), fitrun::v1::JOB_STATE_QUEUED);
  events[0].set_sequence(2);
  JobRecord with_attempt = Record("j", 1, fitrun::v1::JOB_STATE_RUNNING);
  with_attempt.job.add_attempt_history()->set_attempt(1);
  ASSERT_TRUE((*store)->AppendEventsAndPutJob(events, with_attempt).ok());
  EXPECT_EQ((*store)->LoadJobs()->front().job.state(), fitrun::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(*(*store)->LastEventSequence("j"), 2);
}

// The commits turn SQLite's own checkpoint off (wal_autocheckpoint=0); the store's checkpoint thread copies
// the WAL into the database file in passes of its own, which it counts.
TEST(SqliteJobStoreTest, AFullWalIsCopiedIntoTheDatabaseByTheCheckpointThreadsPasses) {
  const std::string path = FreshDb("checkpoint");
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::uintmax_t empty_size = std::filesystem::file_size(path);
  // Well past the WAL's checkpoint threshold (1,000 pages of 4 KiB), in batches as ingest commits.
  constexpr int kEvents = 24000;
  constexpr size_t kText = 200;
  std::vector<fitrun::v1::JobEvent> events;
  for (int i = 1; i <= kEvents; ++i) {
    fitrun::v1::JobEvent& event = events.emplace_back();
    event.set_job_id("j");
    event.set_sequence(i);
    event.mutable_log()->set_text(std::string(kText, 'x'));
    if (events.size() == 100) {
      ASSERT_TRUE((*store)->AppendEvents(events).ok());
      events.clear();
    }
  }
  // The commits only appended to the WAL and asked; the checkpoint thread copies it into the
  // database file.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((std::filesystem::file_size(path) <= empty_size + kText * kEvents / 2 || (*store)->checkpoints() == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(std::filesystem::file_size(path), empty_size + kText * kEvents / 2);
  EXPECT_GE((*store)->checkpoints(), 1);
  EXPECT_EQ(*(*store)->LastEventSequence("j"), kEvents);
}

TEST(SqliteJobStoreTest, TheWalStaysBoundedUnderCommitsThatNeverPause) {
  const std::string path = FreshDb("bounded-wal");
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  // One commit per event, back to back: each appends at least one 4 KiB page, so 60,000 of them
  // would leave a WAL of 240 MB or more if it never started afresh.
  constexpr int kEvents = 60000;
  std::uintmax_t largest_wal = 0;
  fitrun::v1::JobEvent event;
  event.set_job_id("j");
  event.mutable_log()->set_text("a line of the job's log");
  for (int i = 1; i <= kEvents; ++i) {
    event.set_sequence(i);
    ASSERT_TRUE((*store)->AppendEvent(event).ok());
    if (i % 1000 == 0) largest_wal = std::max(largest_wal, std::filesystem::file_size(path + "-wal"));
  }
  // A WAL frame is a 4 KiB page and a 24-byte header; one commit here adds at most a few.
  EXPECT_LT(largest_wal, (SqliteJobStore::kCommitCheckpointFrames + 10) * (4096u + 24))
      << "checkpoints run: " << (*store)->checkpoints();
  EXPECT_EQ(*(*store)->LastEventSequence("j"), kEvents);
}

TEST(SqliteJobStoreTest, AttemptsAreKeptInTheirOwnTable) {
  const std::string path = FreshDb("attempts");
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok());
  JobRecord record = Record("a", 1, fitrun::v1::JOB_STATE_RUNNING);
  record.job.add_attempt_history()->set_attempt(1);
  ASSERT_TRUE((*store)->PutJob(record).ok());
  record.job.mutable_attempt_history(0)->set_outcome("rank 1 exited with code 3");
  record.job.add_attempt_history()->set_attempt(2);
  ASSERT_TRUE((*store)->PutJob(record).ok());
  EXPECT_EQ(CountRows(path, "SELECT COUNT(*) FROM attempts WHERE job_id = 'a'"), 2);
}

TEST(SqliteJobStoreTest, DeletedJobsTakeTheirEventsAndAttemptsAndTheirPagesAreReused) {
  const std::string path = FreshDb("delete");
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok());
  // Rounds of a job with a megabyte of events, each deleted before the next: the file stops growing.
  for (int round = 0; round < 6; ++round) {
    const std::string id = "j-" + std::to_string(round);
    JobRecord record = Record(id, round + 1, fitrun::v1::JOB_STATE_SUCCEEDED);
    record.job.add_attempt_history()->set_attempt(1);
    ASSERT_TRUE((*store)->PutJob(record).ok());
    std::vector<fitrun::v1::JobEvent> events(256);
    for (int i = 0; i < 256; ++i) {
      events[i].set_job_id(id);
      events[i].set_sequence(i + 1);
      events[i].mutable_log()->set_text(std::string(4096, 'e'));
    }
    ASSERT_TRUE((*store)->AppendEvents(events).ok());
    if (round > 0) {
      ASSERT_TRUE((*store)->DeleteJobs({"j-" + std::to_string(round - 1)}).ok());
    }
  }
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job.id(), "j-5");
  EXPECT_EQ(*(*store)->LastEventSequence("j-4"), 0);
  EXPECT_EQ(*(*store)->LastEventSequence("j-5"), 256);
  store->reset();  // its last checkpoint copies the WAL into the file
  // Two jobs' worth (one kept, one being written), where six undeleted would take 6.5 MB.
  EXPECT_LT(std::filesystem::file_size(path), 3u << 20);
  EXPECT_EQ(CountRows(path, "SELECT COUNT(*) FROM attempts"), 1);
}

TEST(SqliteJobStoreTest, OlderSchemaIsMigratedForward) {
  const std::string path = FreshDb("migrate");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE jobs (id TEXT PRIMARY KEY, submit_order INTEGER NOT NULL, state INTEGER NOT NULL,"
                         " token TEXT NOT NULL, job BLOB NOT NULL);"
                         "CREATE TABLE events (job_id TEXT NOT NULL, sequence INTEGER NOT NULL, event BLOB NOT NULL,"
                         " PRIMARY KEY (job_id, sequence)) WITHOUT ROWID; PRAGMA user_version=1;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  JobRecord record = Record("a", 1, fitrun::v1::JOB_STATE_RUNNING);
  record.job.add_attempt_history()->set_attempt(1);
  EXPECT_TRUE((*store)->PutJob(record).ok());
}

TEST(SqliteJobStoreTest, StoreFromANewerSchemaIsRefusedWithAClearError) {
  const std::string path = FreshDb("newer");
  {
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=99;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = SqliteJobStore::Open(path);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
  EXPECT_THAT(store.status().message(), HasSubstr("run a newer fitrund"));
}

}  // namespace
}  // namespace fitrun::server
