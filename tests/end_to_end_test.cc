// fitrund, fitrun-worker and the fitrun CLI as real processes over real gRPC, SQLite, Gloo and
// Fashion-MNIST: the first end-to-end path of a job.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/testing/coordinator.h"

namespace fitrun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTwoDevices[] = "cpu:2x2GiB";

TEST(EndToEndTest, TwoRankJobTrainsWithFallingLossIdenticalParametersAndShowsInMetrics) {
  RunningCoordinator coordinator("e2e-success", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());

  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(MlpSpecYaml("e2e", 40));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(job->id());
  ASSERT_FALSE(events.empty());

  // Dense sequence numbers from 1, ending with the job's final state.
  for (size_t i = 0; i < events.size(); ++i) ASSERT_EQ(events[i].sequence(), static_cast<int64_t>(i + 1));
  ASSERT_TRUE(events.back().has_state_changed());
  const fitrun::v1::Job done = coordinator.Get(job->id());
  ASSERT_EQ(done.state(), fitrun::v1::JOB_STATE_SUCCEEDED)
      << done.failure_reason() << "\n" << ReadFile(coordinator.log_path());
  EXPECT_EQ(events.back().state_changed().to(), fitrun::v1::JOB_STATE_SUCCEEDED);

  std::map<int, std::vector<fitrun::v1::Progress>> progress_by_rank;
  std::map<int, fitrun::v1::RankFinished> finished_by_rank;
  for (const fitrun::v1::JobEvent& event : events) {
    if (event.has_progress()) progress_by_rank[event.progress().rank()].push_back(event.progress());
    if (event.has_rank_finished()) finished_by_rank[event.rank_finished().rank()] = event.rank_finished();
  }
  // Both ranks reported progress, and the loss fell.
  ASSERT_EQ(progress_by_rank.size(), 2u);
  for (auto& [rank, progress] : progress_by_rank) {
    ASSERT_GE(progress.size(), 2u) << "rank " << rank;
    EXPECT_EQ(progress.back().step(), 40) << "rank " << rank;
    EXPECT_LT(progress.back().loss(), progress.front().loss() * 0.8) << "rank " << rank;
    EXPECT_GT(progress.back().samples_per_second(), 0);
  }
  // Both ranks end with bitwise-identical parameters.
  ASSERT_EQ(finished_by_rank.size(), 2u);
  EXPECT_FALSE(finished_by_rank[0].parameter_checksum().empty());
  EXPECT_EQ(finished_by_rank[0].parameter_checksum(), finished_by_rank[1].parameter_checksum());
  EXPECT_TRUE(finished_by_rank[0].has_test_accuracy());
  EXPECT_GT(done.result().test_accuracy(), 0.5);
  EXPECT_EQ(done.result().steps(), 40);
  EXPECT_EQ(done.plan().device_ids_size(), 2);

  // Watching the job after it ended replays the same events and ends.
  const std::vector<fitrun::v1::JobEvent> replay = coordinator.Watch(job->id(), 1, absl::Seconds(20));
  ASSERT_EQ(replay.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(replay[i].SerializeAsString(), events[i].SerializeAsString());

  // /metrics shows the finished job and its steps.
  const std::string metrics = coordinator.Metrics();
  EXPECT_THAT(metrics, HasSubstr("fitrun_jobs{state=\"succeeded\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("fitrun_training_steps_total 40"));
  EXPECT_THAT(metrics, HasSubstr("fitrun_events_received_total{kind=\"progress\"}"));
  EXPECT_TRUE(WaitFor([&] { return WorkersUnder(coordinator.state_dir()).empty(); }, absl::Seconds(10)));
}

TEST(EndToEndTest, BadSpecsAreRejectedNamingTheFieldAndNothingIsStoredOrLaunched) {
  RunningCoordinator coordinator("e2e-bad-spec", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());

  const std::map<std::string, std::string> bad_specs = {
      {"spec.optimiser: unknown field", MlpSpecYaml("bad", 5, "optimiser: {kind: sgd}\n")},
      {"spec.global_batch_size: must be a positive number",
       absl::StrReplaceAll(MlpSpecYaml("bad", 5), {{"global_batch_size: 256", "global_batch_size: -256"}})},
      {"spec.data.path: required",
       absl::StrReplaceAll(MlpSpecYaml("bad", 5), {{", path: /usr/share/datasets/fashion-mnist", ""}})},
  };
  for (const auto& [expected, yaml] : bad_specs) {
    grpc::Status status;
    absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(yaml, &status);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << expected;
    EXPECT_THAT(status.error_message(), HasSubstr(expected));
  }

  // Through the CLI as a user would: the field is named and the exit code says "refused".
  const std::string spec_path = coordinator.state_dir() + "/bad.yaml";
  std::ofstream(spec_path) << MlpSpecYaml("bad", 5, "optimiser: {kind: sgd}\n");
  CommandResult cli = RunCommand({Runfile("client/fitrun"), "--coordinator=" + coordinator.address(), "submit", spec_path});
  EXPECT_NE(cli.exit_code, 0);
  EXPECT_THAT(cli.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(cli.err, HasSubstr("spec.optimiser: unknown field"));

  grpc::ClientContext context;
  fitrun::v1::ListJobsResponse list;
  ASSERT_TRUE(coordinator.stub().ListJobs(&context, {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  EXPECT_TRUE(std::filesystem::is_empty(coordinator.state_dir() + "/jobs"));
}

TEST(EndToEndTest, FailingRankFailsTheJobWithItsExitCodeAndLogAndItsPeerIsStoppedAtOnce) {
  RunningCoordinator coordinator("e2e-failing-rank", kTwoDevices);
  ASSERT_TRUE(coordinator.ok()) << ReadFile(coordinator.log_path());

  // Rank 1 dies before step 5; rank 0 would otherwise wait in its all-reduce for the 60 s timeout.
  // No restarts allowed, so the first failure is the job's end (tests/fault_injection_test covers
  // the restarts).
  absl::StatusOr<fitrun::v1::Job> job = coordinator.Submit(
      MlpSpecYaml("fails", 1000,
                  "fault_injection: {kind: exit, rank: 1, at_step: 5, exit_code: 7}\n"
                  "fault_tolerance: {max_restarts: 0}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<fitrun::v1::JobEvent> events = coordinator.Watch(job->id());
  const fitrun::v1::Job failed = coordinator.Get(job->id());
  ASSERT_EQ(failed.state(), fitrun::v1::JOB_STATE_FAILED) << ReadFile(coordinator.log_path());
  const absl::Time failed_at = absl::Now();
  EXPECT_THAT(failed.failure_reason(), HasSubstr("rank 1 exited with code 7"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("giving up after 0 restart(s)"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("last lines of its log"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("fault injection"));

  // The peer is stopped, not left in its collective: every device is free again within seconds,
  // far inside the 60 s collective timeout, and no worker process remains.
  auto all_devices_free = [&] {
    grpc::ClientContext context;
    fitrun::v1::ListDevicesResponse devices;
    if (!coordinator.stub().ListDevices(&context, {}, &devices).ok()) return false;
    for (const auto& device : devices.devices()) {
      if (!device.job_id().empty()) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitFor(all_devices_free, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - failed_at, absl::Seconds(10));
  EXPECT_TRUE(WorkersUnder(coordinator.state_dir()).empty());

  // The peer's end is on record: stopped by a signal from the coordinator.
  bool peer_exit_seen = false;
  for (const auto& event : coordinator.Watch(job->id(), events.back().sequence() + 1, absl::Seconds(5))) {
    if (event.has_rank_exited() && event.rank_exited().rank() == 0) peer_exit_seen = true;
  }
  EXPECT_TRUE(peer_exit_seen);
}

}  // namespace
}  // namespace fitrun::testing
