#include "server/core/jobs/job_views.h"

#include <gtest/gtest.h>

#include "server/core/jobs/device_holders.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/recording_metrics.h"

namespace fitrun::server {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class JobViewsTest : public ::testing::Test {
 protected:
  // A job admitted to the table whose attempt 1 runs ranks 0 and 1 on cpu:0 and cpu:1, holding them.
  JobEntry& RunningJobOf(const std::string& owner) {
    JobEntry fresh;
    fresh.record.job.set_owner(owner);
    JobEntry& entry = **table_.Admit(std::move(fresh), "submitted");
    fitrun::v1::Job& job = entry.record.job;
    job.set_attempts(1);
    fitrun::v1::AttemptRecord* record = job.add_attempt_history();
    record->set_attempt(1);
    record->add_device_ids("cpu:0");
    record->add_device_ids("cpu:1");
    record->set_predicted_peak_bytes(kGiB);
    record->add_ranks()->set_rank(0);
    record->add_ranks()->set_rank(1);
    entry.active.emplace();
    entry.active->attempt = 1;
    entry.active->device_ids = {"cpu:0", "cpu:1"};
    entry.active->ranks.resize(2);
    entry.active->ranks[1].peak_bytes = kGiB / 4;
    holders_.Hold(job.id(), entry.active->device_ids);
    return entry;
  }

  FakeJobStore store_;
  EventHub hub_;
  RecordingMetrics metrics_;
  JobTable table_{JobTable::Options{0, 0, [] { return absl::FromUnixSeconds(1000); }}, &store_, &hub_, &metrics_};
  FakeDeviceInventory inventory_{3, 2 * kGiB};
  DeviceHolders holders_{&inventory_};
};

TEST_F(JobViewsTest, AHeldDeviceShowsItsJobRankPlanAndPeakAndAReleasedOneIsFreeAgain) {
  JobEntry& entry = RunningJobOf("alice");
  std::vector<fitrun::v1::Device> devices = holders_.Devices(table_);
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[1].job_id(), entry.record.job.id());
  EXPECT_EQ(devices[1].rank(), 1);
  EXPECT_EQ(devices[1].planned_bytes(), kGiB);
  EXPECT_EQ(devices[1].peak_bytes(), kGiB / 4);
  EXPECT_EQ(devices[1].free_bytes(), 2 * kGiB - kGiB / 4) << "a CPU device is free but for its rank's peak";
  EXPECT_TRUE(devices[2].job_id().empty());
  EXPECT_EQ(holders_.HoldingJobs(), std::set<std::string>{entry.record.job.id()});
  holders_.Release(entry.active->device_ids);
  EXPECT_TRUE(holders_.HoldingJobs().empty());
  for (const fitrun::v1::Device& device : holders_.Devices(table_)) {
    EXPECT_TRUE(device.job_id().empty()) << device.id();
    EXPECT_EQ(device.free_bytes(), 2 * kGiB);
  }
}

TEST_F(JobViewsTest, RunningJobsAreThoseHoldingDevicesInSubmissionOrderWithTheirRanks) {
  (void)table_.Admit(JobEntry(), "submitted");  // queued: holds nothing, so it is not running
  JobEntry& first = RunningJobOf("alice");
  std::vector<RunningJob> running = RunningJobs(table_, holders_);
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].job.id(), first.record.job.id());
  ASSERT_EQ(running[0].ranks.size(), 2u);
  EXPECT_EQ(running[0].ranks[1].device_id, "cpu:1");
  EXPECT_EQ(running[0].ranks[1].peak_bytes, kGiB / 4);
  // Once the attempt is gone its ranks are the record's, peaks as measured.
  first.record.job.mutable_attempt_history(0)->set_measured_peak_bytes(kGiB / 2);
  first.active.reset();
  std::vector<RankView> ended = RanksOf(first);
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].peak_bytes, kGiB / 2);
  EXPECT_TRUE(RunningJobs(table_, holders_).empty()) << "an entry without an attempt is not running";
}

TEST_F(JobViewsTest, ARankLogIsFoundOnlyForAnAttemptAndRankTheJobHad) {
  JobEntry& entry = RunningJobOf("alice");
  const std::string id = entry.record.job.id();
  absl::StatusOr<RankLogFile> log = FindRankLog(table_, "/jobs", id, 1, 0);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->job_dir, "/jobs/" + id);
  EXPECT_EQ(log->attempt, 1) << "0 is the latest";
  EXPECT_TRUE(log->attempt_running);
  EXPECT_EQ(FindRankLog(table_, "/jobs", "j-404", 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindRankLog(table_, "/jobs", id, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindRankLog(table_, "/jobs", id, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  JobEntry& queued = **table_.Admit(JobEntry(), "submitted");
  EXPECT_EQ(FindRankLog(table_, "/jobs", queued.record.job.id(), 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobViewsTest, ADeviceHeldByAJobTheCallerMayNotSeeHidesTheJobAndRank) {
  RunningJobOf("alice");
  auto only_bobs = [](const fitrun::v1::Job& job) { return job.owner() == "bob"; };
  std::vector<fitrun::v1::Device> seen = DevicesSeenBy(holders_.Devices(table_), table_, only_bobs);
  EXPECT_TRUE(seen[0].job_id().empty());
  EXPECT_EQ(seen[0].rank(), 0);
  EXPECT_TRUE(seen[0].held_by_another_user());
  EXPECT_FALSE(seen[2].held_by_another_user()) << "a free device is nobody's";
  auto alices = [](const fitrun::v1::Job& job) { return job.owner() == "alice"; };
  EXPECT_FALSE(DevicesSeenBy(holders_.Devices(table_), table_, alices)[0].job_id().empty());
}

}  // namespace
}  // namespace fitrun::server
