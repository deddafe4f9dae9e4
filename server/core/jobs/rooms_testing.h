// The job manager's rooms wired as the manager wires them, over the core's fakes, for tests that
// drive one room with no manager, no lock and no thread: a store, two 4 GiB CPU devices, a launcher
// whose ranks exit when the test says, metrics, and a clock the test moves.
#ifndef FITRUN_SERVER_CORE_JOBS_ROOMS_TESTING_H_
#define FITRUN_SERVER_CORE_JOBS_ROOMS_TESTING_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "server/core/jobs/attempts.h"
#include "server/core/jobs/device_holders.h"
#include "server/core/jobs/job_planner.h"
#include "server/core/jobs/job_table.h"
#include "server/core/jobs/run_memory.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/core/testing/recording_metrics.h"

namespace fitrun::server {

class RoomsForTest {
 public:
  static constexpr int64_t kDeviceBytes = int64_t{4} << 30;

  // A job admitted (`spec` as given) and moved to PLANNING, as a pass does before placing it.
  JobEntry& PlanningJob(const fitrun::v1::JobSpec& spec = {}, const std::string& token = "") {
    JobEntry fresh;
    *fresh.record.job.mutable_spec() = spec;
    fresh.record.token = token;
    JobEntry& entry = **table.Admit(std::move(fresh), "submitted");
    EXPECT_TRUE(table.Transition(entry, fitrun::v1::JOB_STATE_PLANNING, "devices are free").ok());
    return entry;
  }
  // A placement of the entry on cpu:0 and cpu:1 (ranks 0 and 1) at `per_device_batch`.
  static Placement OnTwoDevices(JobEntry& entry, int64_t per_device_batch = 8, int64_t predicted_bytes = 0) {
    fitrun::v1::Plan plan;
    plan.add_device_ids("cpu:0");
    plan.add_device_ids("cpu:1");
    plan.set_per_device_batch(per_device_batch);
    plan.mutable_predicted()->set_total_bytes(predicted_bytes);
    return Placement{&entry, plan, "", false, absl::Milliseconds(1)};
  }
  // Starts a reserved attempt through the fake launcher (no job directory) and commits it.
  void StartAndCommit(PendingLaunch& launch) {
    AttemptLaunch assembled;
    assembled.job_id = launch.job_id;
    assembled.attempt = launch.attempt;
    assembled.ranks.resize(launch.job.plan().device_ids_size());
    attempts.Commit(launch, launcher.Launch(assembled, launch.on_exit), /*stop_now=*/false);
  }
  // Reserve, start and commit: the entry's next attempt RUNNING on `placement`.
  PendingLaunch Run(const Placement& placement) {
    PendingLaunch launch = attempts.Reserve(*placement.entry, placement);
    StartAndCommit(launch);
    return launch;
  }
  // The launcher's rank exits so far, handed to the attempt as the manager hands them on.
  void DeliverExits(JobEntry& entry) {
    for (const auto& [key, exit] : std::exchange(exits, {})) attempts.OnRankExit(entry, key, exit, "");
  }
  // Whether a rank holds the device now.
  bool Held(const std::string& device_id) {
    for (const fitrun::v1::Device& device : holders.Devices(table)) {
      if (device.id() == device_id) return !device.job_id().empty();
    }
    return false;
  }

  absl::Time now = absl::FromUnixSeconds(1000);
  FakeJobStore store;
  EventHub hub;
  RecordingMetrics metrics;
  JobTable table{JobTable::Options{0, 0, [this] { return now; }}, &store, &hub, &metrics};
  FakeDeviceInventory inventory{2, kDeviceBytes};
  DeviceHolders holders{&inventory};
  const JobPlanner planner{JobPlanner::Options{}};
  RunMemory run_memory{&planner, &table, &inventory, &metrics, nullptr, nullptr};
  PlanningGate gate{nullptr, [] {}};
  FakeWorkerLauncher launcher;
  // Rank exits the launcher reported, not yet delivered.
  std::vector<std::pair<WorkerKey, WorkerExit>> exits;
  Attempts attempts{Attempts::Options{"/jobs", absl::Seconds(2), absl::Seconds(3), 0, [this] { return now; },
                                      [this](const fitrun::v1::Job& job, int attempt) {
                                        return [this, id = job.id(), attempt](int rank, const WorkerExit& exit) {
                                          exits.push_back({WorkerKey{id, attempt, rank}, exit});
                                        };
                                      },
                                      [](const std::string&, int) { return AllocationCallback(); }},
                    &table, &holders, &launcher, &metrics, &run_memory, &gate};
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_ROOMS_TESTING_H_
