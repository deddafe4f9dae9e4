// The scheduler's decisions on their own: no manager, no lock, no thread; a pass is one call.
#include "server/core/jobs/scheduler.h"

#include <gtest/gtest.h>

#include <string>

#include "server/core/specs/test_specs.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/core/testing/recording_metrics.h"

namespace fitrun::server {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

class SchedulerTest : public ::testing::Test {
 protected:
  JobEntry& Queue(const fitrun::v1::JobSpec& spec) {
    JobEntry fresh;
    *fresh.record.job.mutable_spec() = spec;
    return **table_.Admit(std::move(fresh), "submitted");
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  FakeJobStore store_;
  EventHub hub_;
  RecordingMetrics metrics_;
  JobTable table_{JobTable::Options{0, 0, [this] { return now_; }}, &store_, &hub_, &metrics_};
  FakeDeviceInventory inventory_{2, 4 * kGiB};
  DeviceHolders holders_{&inventory_};
  const JobPlanner planner_{JobPlanner::Options{}};
  RunMemory run_memory_{&planner_, &table_, &inventory_, &metrics_, nullptr, nullptr};
  PlanningGate gate_{nullptr, [] {}};
  FakeWorkerLauncher launcher_;
  Attempts attempts_{Attempts::Options{"/jobs", absl::Seconds(2), absl::Seconds(3), 0, [this] { return now_; },
                                       [](const fitrun::v1::Job&, int) { return WorkerLauncher::RankExitCallback(); },
                                       [](const std::string&, int) { return AllocationCallback(); }},
                     &table_, &holders_, &launcher_, &metrics_, &run_memory_, &gate_};
  Scheduler scheduler_{Scheduler::Options{}, &table_, &holders_, &attempts_, &planner_, &gate_, &launcher_};
};

TEST_F(SchedulerTest, APassReservesTheHeadOfTheQueueAndNothingBehindItOvertakesIt) {
  JobEntry& wide = Queue(MlpTestSpec(256, /*min_devices=*/2));
  JobEntry& behind = Queue(MlpTestSpec(256, /*min_devices=*/1));
  Scheduler::Placed first = scheduler_.PlaceQueued();
  EXPECT_EQ(first.queued, 2);
  ASSERT_EQ(first.launches.size(), 1u) << "the head takes both devices; the next waits for them";
  EXPECT_EQ(first.launches[0].job_id, wide.record.job.id());
  EXPECT_EQ(first.launches[0].job.plan().device_ids_size(), 2);
  EXPECT_EQ(wide.record.job.state(), fitrun::v1::JOB_STATE_PLANNING);
  EXPECT_TRUE(wide.active.has_value() && wide.active->launching);
  EXPECT_EQ(behind.record.job.state(), fitrun::v1::JOB_STATE_QUEUED);
  // The next pass sees the devices held: nothing is placed twice.
  Scheduler::Placed second = scheduler_.PlaceQueued();
  EXPECT_EQ(second.queued, 1);
  EXPECT_TRUE(second.launches.empty());
}

TEST_F(SchedulerTest, ASubmitThatCouldNeverRunHereIsRefusedNamingTheField) {
  absl::StatusOr<bool> too_wide = scheduler_.ProbeFirstAtSubmit(MlpTestSpec(256, /*min_devices=*/3), "");
  ASSERT_FALSE(too_wide.ok());
  EXPECT_EQ(too_wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_wide.status().message().find("spec.resources.min_devices"), std::string::npos) << too_wide.status();
  absl::StatusOr<bool> fits = scheduler_.ProbeFirstAtSubmit(MlpTestSpec(256, 1), "");
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_FALSE(*fits) << "without a calibrator nothing is measured first";
}

TEST_F(SchedulerTest, ADryRunOnBusyDevicesShowsThePlanItGetsOnceTheyFreeUp) {
  JobEntry& running = Queue(MlpTestSpec(256, /*min_devices=*/2));
  ASSERT_EQ(scheduler_.PlaceQueued().launches.size(), 1u);
  ASSERT_TRUE(running.active.has_value());
  absl::StatusOr<fitrun::v1::Plan> plan = scheduler_.DryRun(MlpTestSpec(256, 1), "");
  ASSERT_TRUE(plan.ok()) << plan.status();
  bool says_queued = false;
  for (const std::string& reason : plan->reasons()) says_queued |= reason.find("queued: not enough devices") == 0;
  EXPECT_TRUE(says_queued);
  EXPECT_EQ(table_.jobs().size(), 1u) << "a dry run stores nothing";
}

}  // namespace
}  // namespace fitrun::server
