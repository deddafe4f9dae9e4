#include "client/top.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/fake_coordinator.h"
#include "client/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);
constexpr int64_t kMiB = int64_t{1} << 20;

RenderContext Context() { return {kNow, absl::UTCTimeZone()}; }

v1::Device CpuDevice(int index, int64_t free_bytes) {
  v1::Device device;
  device.set_id(absl::StrCat("cpu:", index));
  device.set_kind(v1::DEVICE_KIND_CPU);
  device.set_name("virtual CPU device");
  device.set_total_bytes(1024 * kMiB);
  device.set_free_bytes(free_bytes);
  return device;
}

v1::Device HeldDevice(int index, const std::string& job_id, int rank, int64_t planned, int64_t peak) {
  v1::Device device = CpuDevice(index, 1024 * kMiB - planned);
  device.set_job_id(job_id);
  device.set_rank(rank);
  device.set_planned_bytes(planned);
  device.set_peak_bytes(peak);
  return device;
}

v1::Job MakeJob(const std::string& id, const std::string& name, const std::string& owner, v1::JobState state,
                int attempts) {
  v1::Job job;
  job.set_id(id);
  job.mutable_spec()->set_name(name);
  job.set_owner(owner);
  job.set_state(state);
  job.set_attempts(attempts);
  return job;
}

void SetPlan(int64_t batch, int accumulation, int devices, v1::Job* job) {
  v1::Plan* plan = job->mutable_plan();
  for (int i = 0; i < devices; ++i) plan->add_device_ids(absl::StrCat("cpu:", i));
  plan->set_per_device_batch(batch);
  plan->set_grad_accum_steps(accumulation);
}

// A coordinator with three devices (two held by a 2-rank job, rank 1 past its plan) and four
// unfinished jobs, listed in submission order as ListJobs returns them.
class TopTest : public ::testing::Test {
 protected:
  TopTest() {
    v1::ListDevicesResponse devices;
    *devices.add_devices() = HeldDevice(0, "j-000001", 0, 512 * kMiB, 400 * kMiB);
    *devices.add_devices() = HeldDevice(1, "j-000001", 1, 512 * kMiB, 700 * kMiB);
    *devices.add_devices() = CpuDevice(2, 768 * kMiB);
    coordinator_.devices_reply = devices;

    v1::ListJobsResponse jobs;
    v1::Job* running = jobs.add_jobs();
    *running = MakeJob("j-000001", "fashion-mnist-mlp", "local", v1::JOB_STATE_RUNNING, 1);
    SetPlan(128, 1, 2, running);
    v1::Progress* progress = running->mutable_last_progress();
    progress->set_step(120);
    progress->set_total_steps(234);
    progress->set_loss(0.47931);
    progress->set_samples_per_second(6000);
    progress->set_step_seconds(0.0213);
    progress->set_exposed_communication_share(0.31);
    *jobs.add_jobs() = MakeJob("j-000002", "sasrec-movielens", "alice", v1::JOB_STATE_PLANNING, 1);
    *jobs.add_jobs() = MakeJob("j-000003", "gpt-tiny-shakespeare-with-a-long-name", "", v1::JOB_STATE_QUEUED, 0);
    // A script job restarting after a crash: it reports no step time.
    v1::Job* restarting = jobs.add_jobs();
    *restarting = MakeJob("j-000004", "my-script", "alice", v1::JOB_STATE_RESTARTING, 2);
    SetPlan(64, 2, 2, restarting);
    restarting->mutable_last_progress()->set_step(50);
    restarting->mutable_last_progress()->set_total_steps(300);
    restarting->mutable_last_progress()->set_loss(1.2);
    restarting->mutable_last_progress()->set_samples_per_second(40);
    coordinator_.list_reply = jobs;
  }

  // What one refresh of top reads from the coordinator.
  TopSnapshot Snapshot() {
    absl::StatusOr<v1::ListDevicesResponse> devices = coordinator_.ListDevices();
    absl::StatusOr<v1::ListJobsResponse> jobs = coordinator_.ListJobs(TopJobStates());
    EXPECT_TRUE(devices.ok() && jobs.ok());
    return {*devices, *jobs};
  }

  FakeCoordinator coordinator_;
};

TEST_F(TopTest, AWholeFrame) {
  EXPECT_EQ(
      RenderTop(Snapshot(), Context(), {}),
      "fitrun top  2023-11-14 22:13:20 UTC  devices: 3 (2 held)  jobs: 1 running, 1 restarting, 1 planning, 1 queued\n"
      "\n"
      "DEVICE  NAME                  TOTAL       FREE    PLANNED       PEAK  MEMORY          JOB\n"
      "cpu:0   virtual CPU device  1.0 GiB  512.0 MiB  512.0 MiB  400.0 MiB  [#####|......]  j-000001 rank 0\n"
      "cpu:1   virtual CPU device  1.0 GiB  512.0 MiB  512.0 MiB  700.0 MiB  [#####|!!....]  j-000001 rank 1\n"
      "cpu:2   virtual CPU device  1.0 GiB  768.0 MiB          -          -  [###.........]  -\n"
      "\n"
      "JOB       NAME                      OWNER  STATE          STEP    LOSS  SAMPLES/S  STEP TIME  COMM    BATCH  ATTEMPTS\n"
      "j-000001  fashion-mnist-mlp         local  RUNNING     120/234  0.4793      12000      21 ms   31%  128x1x2         1\n"
      "j-000004  my-script                 alice  RESTARTING   50/300  1.2000       80.0          -     -   64x2x2         2\n"
      "j-000002  sasrec-movielens          alice  PLANNING          -       -          -          -     -        -         1\n"
      "j-000003  gpt-tiny-shakespeare-wi…  -      QUEUED            -       -          -          -     -        -         -\n"
      "\n"
      "MEMORY of TOTAL: # peak (in use if idle), ! peak beyond PLANNED, | PLANNED\n"
      "BATCH: per-device batch x accumulation x devices\n"
      "COMM: share of the step time blocked on communication\n");
}

TEST_F(TopTest, ListsOnlyUnfinishedJobsWithThoseUsingDevicesFirst) {
  EXPECT_THAT(TopJobStates(), ElementsAre(v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING, v1::JOB_STATE_PLANNING,
                                          v1::JOB_STATE_QUEUED));
  const std::string frame = RenderTop(Snapshot(), Context(), {});
  EXPECT_LT(frame.find("j-000001"), frame.find("j-000004"));
  EXPECT_LT(frame.find("j-000004"), frame.find("j-000002"));
  EXPECT_LT(frame.find("j-000002"), frame.find("j-000003"));
}

TEST_F(TopTest, LinesAreCutToTheTerminalsWidth) {
  const std::string frame = RenderTop(Snapshot(), Context(), {60, 0});
  std::vector<std::string> lines = absl::StrSplit(frame, '\n');
  ASSERT_EQ(lines.back(), "");
  lines.pop_back();
  EXPECT_EQ(lines.size(), 16u);
  for (const std::string& line : lines) EXPECT_LE(DisplayWidth(line), 60u) << line;
  EXPECT_EQ(lines[3], "cpu:0   virtual CPU device  1.0 GiB  512.0 MiB  512.0 MiB  …");
  // Cells still line up across rows: the cut is the same for every row of a table.
  EXPECT_EQ(lines[4].substr(0, 40), "cpu:1   virtual CPU device  1.0 GiB  512");
}

TEST_F(TopTest, AFrameTallerThanTheTerminalSaysWhatItLeftOut) {
  const std::string frame = RenderTop(Snapshot(), Context(), {0, 11});
  std::vector<std::string> lines = absl::StrSplit(frame, '\n');
  lines.pop_back();
  ASSERT_EQ(lines.size(), 11u);
  EXPECT_EQ(lines[9], "j-000004  my-script                 alice  RESTARTING   50/300  1.2000       80.0          -     -   "
                      "64x2x2         2");
  EXPECT_EQ(lines[10], "... 6 more lines (a taller terminal, or fitrun top --once | less)");
}

TEST_F(TopTest, PlainTextWithoutEscapeCodes) {
  const std::string frame = RenderTop(Snapshot(), Context(), {80, 24});
  EXPECT_EQ(frame.find('\033'), std::string::npos);
  EXPECT_EQ(frame.find('\r'), std::string::npos);
}

TEST_F(TopTest, SaysSoWhenThereIsNothingToShow) {
  coordinator_.devices_reply = v1::ListDevicesResponse();
  coordinator_.list_reply = v1::ListJobsResponse();
  EXPECT_EQ(RenderTop(Snapshot(), Context(), {}),
            "fitrun top  2023-11-14 22:13:20 UTC  devices: 0 (0 held)  jobs: none\n"
            "\n"
            "no devices\n"
            "\n"
            "no running, restarting, planning or queued jobs\n"
            "\n"
            "MEMORY of TOTAL: # peak (in use if idle), ! peak beyond PLANNED, | PLANNED\n"
            "BATCH: per-device batch x accumulation x devices\n"
            "COMM: share of the step time blocked on communication\n");
}

TEST(RenderTopUnavailableTest, SaysWhyAndThatItRetries) {
  EXPECT_EQ(RenderTopUnavailable("UNAVAILABLE: failed to connect to all addresses", Context(), {}),
            "fitrun top  2023-11-14 22:13:20 UTC\n"
            "\n"
            "coordinator unreachable: UNAVAILABLE: failed to connect to all addresses\n"
            "(retrying)\n");
}

TEST(TopMemoryBarTest, PeakAgainstThePlanWhileARankHoldsTheDevice) {
  // Within the plan: the peak, then free cells up to the plan's mark.
  EXPECT_EQ(TopMemoryBar(HeldDevice(0, "j-1", 0, 512 * kMiB, 256 * kMiB)), "[###..|......]");
  // Beyond it: the excess in '!'.
  EXPECT_EQ(TopMemoryBar(HeldDevice(0, "j-1", 0, 256 * kMiB, 768 * kMiB)), "[##|!!!!!!...]");
  // Before the rank's first report there is no peak yet, only the plan.
  EXPECT_EQ(TopMemoryBar(HeldDevice(0, "j-1", 0, 512 * kMiB, 0)), "[.....|......]");
  // A plan under half a cell still shows.
  EXPECT_EQ(TopMemoryBar(HeldDevice(0, "j-1", 0, 10 * kMiB, 9 * kMiB)), "[|...........]");
}

TEST(TopMemoryBarTest, MemoryInUseOnAnIdleDevice) {
  EXPECT_EQ(TopMemoryBar(CpuDevice(0, 1024 * kMiB)), "[............]");
  EXPECT_EQ(TopMemoryBar(CpuDevice(0, 0)), "[############]");
  v1::Device reported = CpuDevice(0, 1024 * kMiB);
  reported.set_used_bytes(512 * kMiB);
  EXPECT_EQ(TopMemoryBar(reported), "[######......]");
  v1::Device unknown;
  EXPECT_EQ(TopMemoryBar(unknown, 4), "[....]");
}

}  // namespace
}  // namespace fitrun::client
