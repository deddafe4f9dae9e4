// The scheduler's decisions on their own: no manager, no lock, no thread; a pass is one call.
#include "server/core/jobs/scheduler.h"

#include <gtest/gtest.h>

#include <string>

#include "server/core/jobs/rooms_testing.h"
#include "server/core/specs/test_specs.h"

namespace fitrun::server {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  JobEntry& Queue(const fitrun::v1::JobSpec& spec) {
    JobEntry fresh;
    *fresh.record.job.mutable_spec() = spec;
    return **rooms_.table.Admit(std::move(fresh), "submitted");
  }

  RoomsForTest rooms_;
  Scheduler scheduler_{Scheduler::Options{}, &rooms_.table, &rooms_.holders, &rooms_.attempts, &rooms_.planner,
                       &rooms_.gate, &rooms_.launcher};
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
  EXPECT_EQ(rooms_.table.jobs().size(), 1u) << "a dry run stores nothing";
}

}  // namespace
}  // namespace fitrun::server
