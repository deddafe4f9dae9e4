// Placement on its own, with the real planner on analytic profiles and the planning gate with and
// without a calibrator: queue order, devices taken by one job are not offered to the next, the head
// job that waits for devices holds the queue (no starving), a job waiting in PLANNING goes back to
// QUEUED when its devices are busy, and a job whose workload is measured waits without holding the
// queue up.
#include "server/core/jobs/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "server/core/specs/test_specs.h"
#include "server/core/specs/workloads.h"
#include "server/core/testing/fake_memory_probe.h"

namespace fitrun::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<DeviceCapacity> Devices(int count, int64_t bytes) {
  std::vector<DeviceCapacity> devices;
  for (int i = 0; i < count; ++i) devices.push_back({absl::StrCat("cpu:", i), bytes, ""});
  return devices;
}

class PlacementTest : public ::testing::Test {
 protected:
  JobEntry& Queue(int min_devices, int max_devices, fitrun::v1::JobState state = fitrun::v1::JOB_STATE_QUEUED) {
    auto entry = std::make_unique<JobEntry>();
    entry->record.job.set_id(absl::StrCat("j-", entries_.size() + 1));
    entry->record.job.set_state(state);
    *entry->record.job.mutable_spec() = MlpTestSpec(256, min_devices, max_devices);
    entries_.push_back(std::move(entry));
    return *entries_.back();
  }
  std::vector<JobEntry*> Queued() {
    std::vector<JobEntry*> queued;
    for (auto& entry : entries_) queued.push_back(entry.get());
    return queued;
  }
  std::vector<Placement> Place(PlanningGate& gate, std::vector<DeviceCapacity> free, std::vector<DeviceCapacity> every) {
    PlanningGate::Pass pass(&gate, every, every.empty() ? 0 : every[0].free_bytes, planner_);
    return PlaceQueuedJobs(Queued(), std::move(free), pass, planner_);
  }

  int plans_ = 0;
  PlanningGate::Planner planner_ = [this](const fitrun::v1::Job& job, const std::vector<DeviceCapacity>& devices) {
    ++plans_;
    return PlanJob(job.spec(), *ProfileFor(job.spec()), devices);
  };
  std::vector<std::unique_ptr<JobEntry>> entries_;
};

TEST_F(PlacementTest, JobsTakeDevicesInQueueOrderAndNoDeviceTwice) {
  PlanningGate analytic(nullptr, [] {});
  Queue(2, 2);
  Queue(1, 1);
  Queue(1, 1);
  const std::vector<Placement> placements = Place(analytic, Devices(4, 1LL << 30), {});
  ASSERT_EQ(placements.size(), 3u);
  std::vector<std::string> taken;
  for (const Placement& placement : placements) {
    ASSERT_TRUE(placement.plan.ok()) << placement.plan.status();
    EXPECT_TRUE(placement.waiting_for.empty());
    for (const std::string& id : placement.plan->device_ids()) taken.push_back(id);
  }
  EXPECT_THAT(taken, ElementsAre("cpu:0", "cpu:1", "cpu:2", "cpu:3"));
}

TEST_F(PlacementTest, TheHeadJobWaitingForDevicesHoldsTheQueue) {
  PlanningGate analytic(nullptr, [] {});
  Queue(3, 3);
  Queue(1, 1);  // would fit on the 2 free devices, but must not jump ahead
  EXPECT_TRUE(Place(analytic, Devices(2, 1LL << 30), {}).empty());
}

TEST_F(PlacementTest, AJobThatWaitedInPlanningGoesBackToTheQueueWhenItsDevicesAreBusy) {
  PlanningGate analytic(nullptr, [] {});
  Queue(3, 3, fitrun::v1::JOB_STATE_PLANNING);
  const std::vector<Placement> placements = Place(analytic, Devices(2, 1LL << 30), {});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_TRUE(placements[0].back_to_queue);
  EXPECT_TRUE(absl::IsUnavailable(placements[0].plan.status()));
}

TEST_F(PlacementTest, AJobThatCannotFitIsPlacedWithThePlannersError) {
  PlanningGate analytic(nullptr, [] {});
  Queue(1, 1);
  const std::vector<Placement> placements = Place(analytic, Devices(1, 1LL << 20), {});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_TRUE(absl::IsResourceExhausted(placements[0].plan.status())) << placements[0].plan.status();
}

TEST_F(PlacementTest, AMeasuredWorkloadWaitsInPlanningWhileJobsOfOthersStart) {
  FakeMemoryProbe probe(MlpPeakBytes);
  probe.Hold();
  std::unique_ptr<MemoryCalibrator> calibrator = *MemoryCalibrator::Create({}, &probe);
  PlanningGate gate(calibrator.get(), [] {});
  // 16 MiB devices: tight for the mlp's analytic estimate, so its workload is measured first.
  JobEntry& first = Queue(1, 1);
  JobEntry& second = Queue(1, 1);
  const std::vector<Placement> placements = Place(gate, Devices(2, 16LL << 20), Devices(2, 16LL << 20));
  ASSERT_EQ(placements.size(), 1u) << "one job per workload waits in PLANNING; the other stays queued";
  EXPECT_EQ(placements[0].entry, &first);
  EXPECT_THAT(placements[0].waiting_for, HasSubstr("measuring memory"));
  EXPECT_FALSE(first.calibration_key.empty());
  EXPECT_EQ(first.calibration_key, second.calibration_key);
  probe.Release();
}

}  // namespace
}  // namespace fitrun::server
