// Test helpers over a real JobManager.
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_TESTING_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_TESTING_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/specs/job_specs.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/core/testing/recording_metrics.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {

// An mlp on Fashion-MNIST with SGD, on `min_devices` to `max_devices` devices: what the core's tests
// submit when the workload does not matter.
inline fitrun::v1::JobSpec MlpSpec(const std::string& name, int64_t global_batch_size, int64_t max_steps,
                                   int min_devices, int max_devices) {
  fitrun::v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  spec.mutable_data()->set_path("/usr/share/datasets/fashion-mnist");
  spec.mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
  spec.mutable_optimizer()->set_lr(0.05);
  spec.set_global_batch_size(global_batch_size);
  spec.set_max_steps(max_steps);
  spec.mutable_resources()->set_min_devices(min_devices);
  spec.mutable_resources()->set_max_devices(max_devices);
  return spec;
}

// A JobManager over fakes, as the core's tests build it: a state directory of the test's own, the
// options every test starts from, and the fakes it runs against (a store, two 4 GiB CPU devices, a
// launcher, metrics), which outlive the manager. A test changes options() or the devices before
// Start(); Restart() is a coordinator restart, a new manager over the same store, devices, launcher
// and state directory. One test thread at a time.
class TestJobManager {
 public:
  // `launcher`, when set, stands in for the builder's own FakeWorkerLauncher (a test's subclass of
  // it); it must outlive the builder.
  explicit TestJobManager(FakeWorkerLauncher* launcher = nullptr)
      : launcher_(launcher != nullptr ? launcher : &own_launcher_) {
    options_.state_dir = state_dir_.path();
    options_.worker_binary = "/bin/fitrun-worker";
    options_.worker_channel_address = "127.0.0.1:1";  // never dialled: the fakes start no worker
    options_.final_report_wait = absl::Milliseconds(200);
  }
  ~TestJobManager() { Stop(); }
  TestJobManager(const TestJobManager&) = delete;
  TestJobManager& operator=(const TestJobManager&) = delete;

  // What the next Start() builds the manager with.
  JobManager::Options& options() { return options_; }
  // Before Start() only: the devices the manager sees instead of two 4 GiB CPUs.
  void set_devices(FakeDeviceInventory devices) { devices_ = std::move(devices); }

  // Creates the manager; the state directory must have been made (a test failure otherwise).
  absl::Status Start() {
    if (!state_dir_.ok()) return absl::InternalError("could not make the test's state directory");
    absl::StatusOr<std::unique_ptr<JobManager>> manager =
        JobManager::Create(options_, &store_, &devices_, launcher_, &metrics_);
    if (!manager.ok()) return manager.status();
    manager_ = *std::move(manager);
    return absl::OkStatus();
  }
  // Destroys the manager, leaving the fakes and the state directory as it left them.
  void Stop() { manager_.reset(); }
  // A coordinator restart: Stop() then Start() with the same fakes and options().
  absl::Status Restart() {
    Stop();
    return Start();
  }

  JobManager& manager() { return *manager_; }
  FakeJobStore& store() { return store_; }
  FakeWorkerLauncher& launcher() { return *launcher_; }
  RecordingMetrics& metrics() { return metrics_; }
  std::filesystem::path state_dir() const { return options_.state_dir; }

 private:
  TempDir state_dir_{"job-manager-"};
  JobManager::Options options_;
  FakeJobStore store_;
  FakeDeviceInventory devices_{2, 4LL << 30};
  FakeWorkerLauncher own_launcher_;
  FakeWorkerLauncher* launcher_;
  RecordingMetrics metrics_;
  std::unique_ptr<JobManager> manager_;  // last: destroyed before what it points to
};

// Waits (on the manager's own state, never a bare sleep) for the job to reach `state`; a test
// failure, and the job as it is, if it does not within 5 s.
inline fitrun::v1::Job WaitForState(JobManager& manager, const std::string& id, fitrun::v1::JobState state) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  fitrun::v1::Job job;
  while (absl::Now() < deadline) {
    job = *manager.Get(id);
    if (job.state() == state) return job;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ADD_FAILURE() << "job " << id << " is " << JobStateName(job.state()) << ", wanted " << JobStateName(state);
  return job;
}

// The mlp spec on `min_devices` to `max_devices` devices at `priority`, ten steps.
inline fitrun::v1::JobSpec Spec(int min_devices, int max_devices, int priority = 0) {
  fitrun::v1::JobSpec spec = MlpSpec("unit", 256, 10, min_devices, max_devices);
  spec.set_priority(priority);
  return spec;
}

// The fixture of the manager's lifecycle tests: a started TestJobManager and the reports its ranks
// send.
class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(jobs_.Start(), absl::OkStatus()); }

  fitrun::v1::Job WaitForState(const std::string& id, fitrun::v1::JobState state) {
    return server::WaitForState(jobs_.manager(), id, state);
  }

  static std::map<std::string, std::string> EnvOf(const WorkerLaunch& launch) {
    return {launch.env.begin(), launch.env.end()};
  }

  void Report(const std::string& job_id, int attempt, int rank, const fitrun::v1::WorkerReport& report) {
    jobs_.manager().OnWorkerReport(WorkerKey{job_id, attempt, rank}, report);
  }

  // Submits `spec` and waits until the launcher has seen `launches` launches in all and the job runs;
  // returns the job as submitted.
  absl::StatusOr<fitrun::v1::Job> SubmitRunning(const fitrun::v1::JobSpec& spec, size_t launches) {
    absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(spec);
    if (!job.ok()) return job;
    EXPECT_TRUE(jobs_.launcher().WaitForLaunches(launches, absl::Seconds(5)));
    WaitForState(job->id(), fitrun::v1::JOB_STATE_RUNNING);
    return job;
  }
  // The same, for its id ("" and a test failure when the submit failed).
  std::string SubmitAndWaitRunning(const fitrun::v1::JobSpec& spec, size_t launches) {
    absl::StatusOr<fitrun::v1::Job> job = SubmitRunning(spec, launches);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  void ReportOutOfMemory(const std::string& job_id, int attempt, int rank, int64_t step, int64_t batch) {
    fitrun::v1::WorkerReport report;
    report.mutable_oom()->set_step(step);
    report.mutable_oom()->set_per_device_batch(batch);
    Report(job_id, attempt, rank, report);
  }

  void ReportFinished(const std::string& job_id, int rank, double accuracy) {
    fitrun::v1::WorkerReport report;
    report.mutable_finished()->set_steps(10);
    report.mutable_finished()->set_final_loss(0.5);
    report.mutable_finished()->set_parameter_checksum("abc");
    if (rank == 0) {
      report.mutable_finished()->set_has_test_accuracy(true);
      report.mutable_finished()->set_test_accuracy(accuracy);
      (*report.mutable_finished()->mutable_metrics())["hr@10"] = accuracy;
    }
    Report(job_id, 1, rank, report);
  }

  TestJobManager jobs_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_MANAGER_TESTING_H_
