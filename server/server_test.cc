// The start-up steps that derive something from fitrund's flags alone (server.h, namespace startup):
// the --listen address ranks are told, where they dial the WorkerChannel, and the job limits' checks.
#include "server/server.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace fitrun::server::startup {
namespace {

TEST(ResolveListenTest, KeepsHostAndPortAndDialsTheHostItself) {
  absl::StatusOr<ListenAddress> listen = ResolveListen("10.1.2.3:7070");
  ASSERT_TRUE(listen.ok()) << listen.status();
  EXPECT_EQ(listen->host, "10.1.2.3");
  EXPECT_EQ(listen->port, "7070");
  EXPECT_EQ(listen->dial_host, "10.1.2.3");
  EXPECT_EQ(listen->address(), "10.1.2.3:7070");
}

TEST(ResolveListenTest, WildcardHostsAreDialedOnLoopback) {
  for (const char* given : {"0.0.0.0:7070", "[::]:7070", ":7070"}) {
    absl::StatusOr<ListenAddress> listen = ResolveListen(given);
    ASSERT_TRUE(listen.ok()) << given << ": " << listen.status();
    EXPECT_EQ(listen->dial_host, "127.0.0.1") << given;
    EXPECT_EQ(listen->address(), given) << given;
  }
}

TEST(ResolveListenTest, PortZeroBecomesAConcreteFreePort) {
  absl::StatusOr<ListenAddress> listen = ResolveListen("127.0.0.1:0");
  ASSERT_TRUE(listen.ok()) << listen.status();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(listen->port, &port)) << listen->port;
  EXPECT_GT(port, 0);
  EXPECT_EQ(listen->address(), "127.0.0.1:" + listen->port);
}

TEST(ResolveListenTest, WithoutAPortTheFlagIsNamed) {
  absl::StatusOr<ListenAddress> listen = ResolveListen("localhost");
  ASSERT_FALSE(listen.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(listen.status()));
  EXPECT_EQ(listen.status().message(), "--listen: expected HOST:PORT, e.g. 127.0.0.1:7070");
}

TEST(WorkerChannelAddressTest, WithoutAdvertiseRanksDialTheListenAddress) {
  const ListenAddress listen{"0.0.0.0", "7070", "127.0.0.1"};
  EXPECT_EQ(WorkerChannelAddress("", listen), "127.0.0.1:7070");
}

TEST(WorkerChannelAddressTest, AnAdvertisedHostGetsTheListenPort) {
  const ListenAddress listen{"0.0.0.0", "7070", "127.0.0.1"};
  EXPECT_EQ(WorkerChannelAddress("head.cluster", listen), "head.cluster:7070");
  EXPECT_EQ(WorkerChannelAddress("[fd00::1]", listen), "[fd00::1]:7070");
}

TEST(WorkerChannelAddressTest, AnAdvertisedPortIsKept) {
  const ListenAddress listen{"0.0.0.0", "7070", "127.0.0.1"};
  EXPECT_EQ(WorkerChannelAddress("head.cluster:9000", listen), "head.cluster:9000");
  EXPECT_EQ(WorkerChannelAddress("[fd00::1]:9000", listen), "[fd00::1]:9000");
}

TEST(SetJobLimitsTest, CopiesTheLimitsIntoTheManagersOptions) {
  ServerOptions options;
  options.max_jobs_per_user = 7;
  options.retain_finished_jobs = 0;
  options.max_events_per_job = 500;
  options.min_account_uid = 2000;
  JobManager::Options manager;
  ASSERT_TRUE(SetJobLimits(options, manager).ok());
  EXPECT_EQ(manager.max_open_jobs_per_owner, 7);
  EXPECT_EQ(manager.retain_finished_jobs, 0);
  EXPECT_EQ(manager.max_events_per_job, 500);
  EXPECT_EQ(manager.min_account_uid, 2000u);
}

TEST(SetJobLimitsTest, ANegativeBoundNamesItsFlag) {
  ServerOptions options;
  options.retain_finished_jobs = -1;
  JobManager::Options manager;
  absl::Status status = SetJobLimits(options, manager);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_EQ(status.message(), "--retain_finished_jobs: 0 (no bound) or more (got -1)");

  options.retain_finished_jobs = 10;
  options.max_events_per_job = -3;
  status = SetJobLimits(options, manager);
  EXPECT_EQ(status.message(), "--max_events_per_job: 0 (no bound) or more (got -3)");
}

TEST(SetJobLimitsTest, RootsUidIsRefused) {
  ServerOptions options;
  options.min_account_uid = 0;
  JobManager::Options manager;
  const absl::Status status = SetJobLimits(options, manager);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_TRUE(absl::StartsWith(status.message(), "--min_account_uid: at least 1")) << status;
}

}  // namespace
}  // namespace fitrun::server::startup
