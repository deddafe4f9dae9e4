#include "worker/report/grpc_reporter.h"
#include "proto/contract/free_port.h"

#include <atomic>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/report/fake_coordinator.h"

namespace fitrun::worker {
namespace {

using fitrun::v1::WorkerReport;

// Brings `coordinator` up on `port`, where the reporter has been dialing in vain, lets the reporter
// deliver everything it queued meanwhile, and returns what arrived, in order.
std::vector<WorkerReport> DrainIntoCoordinatorAt(FakeCoordinator& coordinator, int port, GrpcReporter& reporter) {
  int bound = 0;
  auto server = coordinator.Serve(&bound, port);
  EXPECT_EQ(bound, port);
  reporter.Shutdown(absl::Seconds(10));
  std::vector<WorkerReport> reports = coordinator.reports();
  server->Shutdown();
  return reports;
}

GrpcReporter::Options OptionsFor(int port) {
  GrpcReporter::Options options;
  options.coordinator = "127.0.0.1:" + std::to_string(port);
  options.job_id = "job-7";
  options.attempt = 2;
  options.rank = 1;
  options.world_size = 2;
  options.job_token = "secret";
  options.pid = 4242;
  options.heartbeat_interval = absl::ZeroDuration();  // exact report lists; one test turns them on
  return options;
}

StepProgress Step(int64_t step) {
  StepProgress p;
  p.rank = 1;
  p.step = step;
  p.total_steps = 10;
  p.epoch = 1;
  p.loss = 1.0 / step;
  return p;
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

TEST(GrpcReporterTest, HelloFirstThenReportsThenAFinishedStream) {
  FakeCoordinator coordinator;
  int port = 0;
  auto server = coordinator.Serve(&port);
  ASSERT_NE(port, 0);

  auto reporter = GrpcReporter::Create(OptionsFor(port), nullptr);
  ASSERT_TRUE(reporter.ok()) << reporter.status();
  (*reporter)->OnProgress(Step(1));
  (*reporter)->OnLog("hello from the test");
  (*reporter)->OnProgress(Step(2));
  fitrun::v1::RankFinished finished;
  finished.set_steps(10);
  finished.set_parameter_checksum("0123456789abcdef");
  (*reporter)->ReportFinished(finished);
  (*reporter)->Shutdown(absl::Seconds(5));

  const std::vector<WorkerReport> reports = coordinator.reports();
  ASSERT_EQ(reports.size(), 5u);
  ASSERT_TRUE(reports[0].has_hello());
  EXPECT_EQ(reports[0].hello().job_id(), "job-7");
  EXPECT_EQ(reports[0].hello().attempt(), 2);
  EXPECT_EQ(reports[0].hello().rank(), 1);
  EXPECT_EQ(reports[0].hello().world_size(), 2);
  EXPECT_EQ(reports[0].hello().job_token(), "secret");
  EXPECT_EQ(reports[0].hello().pid(), 4242);
  EXPECT_EQ(reports[1].progress().step(), 1);
  EXPECT_EQ(reports[1].progress().rank(), 1);
  EXPECT_EQ(reports[2].log().text(), "hello from the test");
  EXPECT_EQ(reports[3].progress().step(), 2);
  ASSERT_TRUE(reports[4].has_finished());
  EXPECT_EQ(reports[4].finished().rank(), 1);
  EXPECT_EQ(reports[4].finished().parameter_checksum(), "0123456789abcdef");
  // WritesDone reached the coordinator: the stream ended cleanly from the worker's side.
  EXPECT_EQ(coordinator.streams_closed_by_worker(), 1);
  server->Shutdown();
}

// The coordinator sends the stop three times (as it does when several peers fail at once): the
// rank's callback runs once.
TEST(GrpcReporterTest, StopCommandReachesTheCallbackOnce) {
  FakeCoordinator coordinator;
  coordinator.stop_after_hello = true;
  coordinator.stops_to_send = 3;
  int port = 0;
  auto server = coordinator.Serve(&port);
  absl::Notification stopped;
  std::atomic<int> calls{0};
  std::string reason;
  auto reporter = GrpcReporter::Create(OptionsFor(port), [&](const std::string& r) {
    if (calls.fetch_add(1) == 0) {
      reason = r;
      stopped.Notify();
    }
  });
  ASSERT_TRUE(reporter.ok());
  ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(reason, "peer rank 1 exited");
  (*reporter)->ReportFailed("stopped by the coordinator");
  (*reporter)->Shutdown(absl::Seconds(5));
  // Shutdown closed the stream after the reader took every command the coordinator wrote.
  EXPECT_EQ(coordinator.stops_sent(), 3);
  EXPECT_EQ(calls.load(), 1);
  const std::vector<WorkerReport> reports = coordinator.reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_TRUE(reports.back().has_failed());
  server->Shutdown();
}

// With nobody to send to, reports past the queue's capacity are dropped rather than waited for, and
// Flush does not wait for a connection that is not there: were either to wait, this test would not
// end before its timeout (Flush is given an hour).
TEST(GrpcReporterTest, UnreachableCoordinatorDropsReportsPastTheQueueInsteadOfBlocking) {
  GrpcReporter::Options options = OptionsFor(fitrun::contract::PickFreeLoopbackPort().value());
  options.queue_capacity = 16;
  auto reporter = GrpcReporter::Create(options, nullptr);
  ASSERT_TRUE(reporter.ok());
  for (int i = 1; i <= 10000; ++i) (*reporter)->OnProgress(Step(i));
  (*reporter)->Flush(absl::Hours(1));
  EXPECT_GE((*reporter)->dropped(), 10000 - 16);
  (*reporter)->Shutdown(absl::Milliseconds(300));
}

TEST(GrpcReporterTest, ACoordinatorThatStartsLateStillGetsTheFinishedReport) {
  const int port = fitrun::contract::PickFreeLoopbackPort().value();
  GrpcReporter::Options options = OptionsFor(port);
  options.max_backoff = absl::Milliseconds(200);
  auto reporter = GrpcReporter::Create(options, nullptr);
  ASSERT_TRUE(reporter.ok());
  fitrun::v1::RankFinished finished;
  finished.set_steps(3);
  (*reporter)->ReportFinished(finished);
  absl::SleepFor(absl::Milliseconds(500));

  FakeCoordinator coordinator;
  const std::vector<WorkerReport> reports = DrainIntoCoordinatorAt(coordinator, port, **reporter);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_TRUE(reports[0].has_hello());
  EXPECT_EQ(reports[1].finished().steps(), 3);
}

// Reports queued while the coordinator was away go out together: the Hello alone first, then
// batches of at most max_reports_per_message, in order.
TEST(GrpcReporterTest, QueuedReportsTravelInBatchesAfterTheHello) {
  const int port = fitrun::contract::PickFreeLoopbackPort().value();
  GrpcReporter::Options options = OptionsFor(port);
  options.max_backoff = absl::Milliseconds(200);
  options.max_reports_per_message = 4;
  auto reporter = GrpcReporter::Create(options, nullptr);
  ASSERT_TRUE(reporter.ok());
  for (int step = 1; step <= 10; ++step) (*reporter)->OnProgress(Step(step));
  fitrun::v1::RankFinished finished;
  finished.set_steps(10);
  (*reporter)->ReportFinished(finished);
  absl::SleepFor(absl::Milliseconds(300));

  FakeCoordinator coordinator;
  const std::vector<WorkerReport> reports = DrainIntoCoordinatorAt(coordinator, port, **reporter);
  ASSERT_EQ(reports.size(), 12u);
  EXPECT_TRUE(reports[0].has_hello());
  for (int step = 1; step <= 10; ++step) EXPECT_EQ(reports[step].progress().step(), step);
  EXPECT_EQ(reports[11].finished().steps(), 10);
  // Hello, then 11 reports in messages of at most 4: 1 + 3 messages, all three of them batches.
  EXPECT_EQ(coordinator.messages(), 4);
  EXPECT_EQ(coordinator.batches(), 3);
}

TEST(GrpcReporterTest, QuietRanksSendHeartbeatsWithTheLastStep) {
  FakeCoordinator coordinator;
  int port = 0;
  auto server = coordinator.Serve(&port);
  GrpcReporter::Options options = OptionsFor(port);
  options.heartbeat_interval = absl::Milliseconds(50);
  auto reporter = GrpcReporter::Create(options, nullptr);
  ASSERT_TRUE(reporter.ok());
  (*reporter)->OnProgress(Step(7));
  auto heartbeats = [&] {
    std::vector<int64_t> steps;
    for (const WorkerReport& r : coordinator.reports()) {
      if (r.has_heartbeat()) steps.push_back(r.heartbeat().step());
    }
    return steps;
  };
  ASSERT_TRUE(WaitFor([&] { return heartbeats().size() >= 2; }, absl::Seconds(5)));
  EXPECT_EQ(heartbeats().back(), 7);
  (*reporter)->Shutdown(absl::Seconds(2));
  server->Shutdown();
}

TEST(GrpcReporterTest, RefusedStreamIsNotRetried) {
  FakeCoordinator coordinator;
  coordinator.reject = true;
  int port = 0;
  auto server = coordinator.Serve(&port);
  auto reporter = GrpcReporter::Create(OptionsFor(port), nullptr);
  ASSERT_TRUE(reporter.ok());
  ASSERT_TRUE(WaitFor([&] { return coordinator.hellos() == 1; }, absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(700));  // several backoff periods
  (*reporter)->OnProgress(Step(1));
  EXPECT_EQ(coordinator.hellos(), 1);
  EXPECT_TRUE(WaitFor([&] { return (*reporter)->dropped() >= 1; }, absl::Seconds(2)));
  (*reporter)->Shutdown(absl::Seconds(1));
  EXPECT_EQ(coordinator.hellos(), 1);
  server->Shutdown();
}

}  // namespace
}  // namespace fitrun::worker
