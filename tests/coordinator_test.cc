// The coordinator's lifecycle guarantees with real processes: a SIGKILLed fitrund loses no job and
// no event, many jobs share two devices in priority order, cancel frees devices at once, and every
// watcher sees the same events.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/testing/coordinator.h"

namespace fitrun::testing {
namespace {

using ::testing::HasSubstr;

bool AllDevicesFree(RunningCoordinator& coordinator) {
  grpc::ClientContext context;
  fitrun::v1::ListDevicesResponse devices;
  if (!coordinator.stub().ListDevices(&context, {}, &devices).ok()) return false;
  for (const auto& device : devices.devices()) {
    if (!device.job_id().empty()) return false;
  }
  return true;
}

// Reads the job's events as they come until `predicate` holds for one of them.
bool WatchUntil(RunningCoordinator& coordinator, const std::string& job_id,
                const std::function<bool(const fitrun::v1::JobEvent&)>& predicate, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  fitrun::v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = coordinator.stub().WatchJob(&context, request);
  fitrun::v1::JobEvent event;
  bool seen = false;
  while (!seen && reader->Read(&event)) seen = predicate(event);
  context.TryCancel();
  reader->Finish();
  return seen;
}

void ExpectDenseAndUnique(const std::vector<fitrun::v1::JobEvent>& events) {
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].sequence(), static_cast<int64_t>(i + 1)) << "gap or duplicate at position " << i;
  }
}

TEST(CoordinatorTest, SigkilledCoordinatorRestartsAndTheJobCompletesWithoutEventGapsOrDuplicates) {
  RunningCoordinator coordinator("restart", "cpu:2x2GiB");
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml("restart", 600));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WatchUntil(coordinator, job->id(),
                         [](const fitrun::v1::JobEvent& e) { return e.has_progress() && e.progress().step() >= 20; },
                         absl::Seconds(60)));
  const std::vector<fitrun::v1::JobEvent> before = coordinator.Watch(job->id(), 1, absl::Seconds(1));
  // The comparison below means something only if the watcher saw training before the crash.
  ASSERT_TRUE(std::any_of(before.begin(), before.end(),
                          [](const fitrun::v1::JobEvent& e) { return e.has_progress() && e.progress().step() >= 20; }))
      << before.size() << " events seen before the crash";

  coordinator.Kill();
  ASSERT_TRUE(coordinator.Restart()) << ReadFile(coordinator.log_path());
  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(job->id());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED) << done.failure_reason() << ReadFile(coordinator.log_path());
  // Ranks kept training and were re-adopted: one attempt, no restart.
  EXPECT_EQ(done.attempts(), 1);
  EXPECT_EQ(done.result().steps(), 600);

  ExpectDenseAndUnique(events);
  // What watchers saw before the crash is exactly what the store replays after it.
  ASSERT_GE(events.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(events[i].SerializeAsString(), before[i].SerializeAsString()) << "event " << i + 1;
  }
  bool readopted = false;
  for (const auto& e : events) {
    if (e.has_log() && absl::StrContains(e.log().text(), "re-adopted all 2 ranks")) readopted = true;
  }
  EXPECT_TRUE(readopted);
}

TEST(CoordinatorTest, TwentyJobsOnTwoDevicesAllCompleteInPriorityOrder) {
  RunningCoordinator coordinator("twenty", "cpu:2x2GiB");
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  // A two-device job holds both devices while the twenty queue up behind it.
  absl::StatusOr<fitrun::v1::Job> blocker = coordinator.Submit(MlpSpecYaml("blocker", 150));
  ASSERT_TRUE(blocker.ok());
  std::vector<std::pair<std::string, int>> jobs;  // (id, priority) in submission order
  for (int i = 0; i < 20; ++i) {
    const int priority = (i * 7) % 4;  // 0, 3, 2, 1, 0, 3, ...
    std::string yaml = absl::StrCat("name: small-", i, "\n"
                                    "model: {builtin: mlp}\n"
                                    "data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
                                    "optimizer: {kind: sgd, lr: 0.05}\n"
                                    "global_batch_size: 64\n"
                                    "max_steps: 1\n"
                                    "resources: {min_devices: 1, max_devices: 1}\n"
                                    "priority: ", priority, "\n");
    absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(yaml);
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.emplace_back(job->id(), priority);
  }
  EXPECT_EQ(coordinator.Get(jobs.back().first).state(), fitrun::v1::JOB_STATE_QUEUED);

  for (const auto& [id, priority] : jobs) {
    coordinator.Watch(id, 1, absl::Seconds(240));
    ASSERT_EQ(coordinator.Get(id).state(), fitrun::v1::JOB_STATE_SUCCEEDED) << id << "\n" << ReadFile(coordinator.log_path());
  }
  // Started in priority order, then submission order.
  std::vector<std::pair<std::string, int>> expected = jobs;
  std::stable_sort(expected.begin(), expected.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::pair<int64_t, std::string>> started;
  for (const auto& [id, priority] : jobs) {
    const fitrun::v1::Job job = coordinator.Get(id);
    started.emplace_back(job.started_at().seconds() * 1000000000 + job.started_at().nanos(), id);
  }
  std::sort(started.begin(), started.end());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(started[i].second, expected[i].first) << "start #" << i;
}

// How long the devices take to free is a benchmark's figure (fault_injection_test prints the stop
// times); here: cancel stops every rank and frees every device.
TEST(CoordinatorTest, CancelStopsEveryRankAndFreesItsDevices) {
  RunningCoordinator coordinator("cancel", "cpu:2x2GiB");
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml("cancel", 100000));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WatchUntil(coordinator, job->id(), [](const fitrun::v1::JobEvent& e) { return e.has_progress(); },
                         absl::Seconds(60)));
  grpc::ClientContext context;
  fitrun::v1::CancelJobRequest request;
  request.set_job_id(job->id());
  fitrun::v1::CancelJobResponse response;
  const grpc::Status cancelled = coordinator.stub().CancelJob(&context, request, &response);
  ASSERT_TRUE(cancelled.ok()) << cancelled.error_message() << "\n"
                              << coordinator.Get(job->id()).ShortDebugString() << "\n"
                              << ReadFile(coordinator.log_path());
  ASSERT_TRUE(WaitFor([&] { return AllDevicesFree(coordinator); }, absl::Seconds(10)));
  EXPECT_EQ(coordinator.Get(job->id()).state(), fitrun::v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(WorkersUnder(coordinator.state_dir()).empty());
}

TEST(CoordinatorTest, WatchersStartingAtDifferentSequencesSeeIdenticalSuffixes) {
  RunningCoordinator coordinator("watchers", "cpu:2x2GiB");
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml("watched", 60));
  ASSERT_TRUE(job.ok());
  const std::vector<int64_t> starts = {1, 3, 6, 9};
  std::vector<std::vector<fitrun::v1::JobEvent>> seen(starts.size());
  std::vector<std::thread> watchers;
  for (size_t i = 0; i < starts.size(); ++i) {
    watchers.emplace_back([&, i] { seen[i] = coordinator.Watch(job->id(), starts[i]); });
  }
  for (auto& t : watchers) t.join();
  ASSERT_EQ(coordinator.Get(job->id()).state(), fitrun::v1::JOB_STATE_SUCCEEDED);
  ExpectDenseAndUnique(seen[0]);
  for (size_t i = 0; i < starts.size(); ++i) {
    ASSERT_FALSE(seen[i].empty());
    EXPECT_EQ(seen[i].front().sequence(), starts[i]);
    ASSERT_EQ(seen[i].size(), seen[0].size() - static_cast<size_t>(starts[i] - 1));
    for (size_t k = 0; k < seen[i].size(); ++k) {
      EXPECT_EQ(seen[i][k].SerializeAsString(), seen[0][k + starts[i] - 1].SerializeAsString());
    }
  }
  // The same job's logs through the CLI, as a user reads them.
  CommandResult logs = RunCommand({Runfile("client/fitrun"), "--coordinator=" + coordinator.address(), "logs",
                                   job->id(), "--rank", "1"});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("rank 1/2"));
}

TEST(CoordinatorTest, StoreFromANewerSchemaIsRefusedAtStart) {
  const std::string dir = FreshTestDir("newer-schema");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/fitrun.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=99;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  CommandResult result = RunCommand({Runfile("server/fitrund"), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                     "--state_dir=" + dir, "--devices=cpu:1x1GiB"},
                                    absl::Seconds(30));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("schema version 99"));
  EXPECT_THAT(result.err, HasSubstr("run a newer fitrund"));
}

TEST(CoordinatorTest, ASecondCoordinatorOnAPortInUseRefusesToStart) {
  RunningCoordinator first("port-held", "cpu:1x1GiB");
  ASSERT_TRUE(first.ok()) << ReadFile(first.log_path());
  const std::string dir = FreshTestDir("port-taken");
  CommandResult second = RunCommand({Runfile("server/fitrund"), "--listen=" + first.address(),
                                     "--metrics_listen=127.0.0.1:0", "--state_dir=" + dir, "--devices=cpu:1x1GiB"},
                                    absl::Seconds(30));
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.err, HasSubstr("--listen: cannot listen on " + first.address()));
  grpc::ClientContext context;
  fitrun::v1::ListJobsResponse jobs;
  EXPECT_TRUE(first.stub().ListJobs(&context, fitrun::v1::ListJobsRequest(), &jobs).ok());
}

TEST(CoordinatorTest, ASecondCoordinatorOnAHeldStateDirectoryRefusesAndStartsOnceTheFirstIsKilled) {
  RunningCoordinator first("held-state", "cpu:1x1GiB");
  ASSERT_TRUE(first.ok()) << ReadFile(first.log_path());
  const std::string holder(absl::StripAsciiWhitespace(ReadFile(first.state_dir() + "/fitrund.lock")));
  ASSERT_FALSE(holder.empty());

  CommandResult second = RunCommand({Runfile("server/fitrund"), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                     "--state_dir=" + first.state_dir(), "--devices=cpu:1x1GiB"},
                                    absl::Seconds(30));
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.err, HasSubstr("is in use by another fitrund (pid " + holder + ","));
  // The first one still serves.
  {
    grpc::ClientContext context;
    fitrun::v1::ListJobsResponse jobs;
    EXPECT_TRUE(first.stub().ListJobs(&context, fitrun::v1::ListJobsRequest(), &jobs).ok());
  }

  // The kernel drops a SIGKILLed holder's lock: its successor starts at once.
  first.Kill();
  const absl::Time restart = absl::Now();
  ASSERT_TRUE(first.Restart()) << ReadFile(first.log_path());
  std::printf("restarted on the released state directory in %.2f s\n", absl::ToDoubleSeconds(absl::Now() - restart));
  EXPECT_NE(std::string(absl::StripAsciiWhitespace(ReadFile(first.state_dir() + "/fitrund.lock"))), holder);
}

}  // namespace
}  // namespace fitrun::testing
