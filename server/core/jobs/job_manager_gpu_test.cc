// The job manager on GPUs (a fake inventory of CUDA devices): a plan counts what a rank's process holds
// beyond its tensors and says with which allocator settings; the ranks are launched with those
// settings and, on a slice, with the slice as their cap; a script's own settings are planned with;
// and the peaks a run reports (allocated, reserved, the whole process) are kept on the attempt and
// correct the costs the next plan on that GPU model assumes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "google/protobuf/text_format.h"
#include "server/core/calibration/device_costs_book.h"
#include "absl/strings/str_join.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"
#include "server/core/testing/fake_device_inventory.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr char kH100[] = "NVIDIA H100 80GB HBM3";

class JobManagerGpuTest : public ::testing::Test {
 protected:
  void Start(FakeDeviceInventory devices) {
    jobs_.set_devices(std::move(devices));
    book_ = *DeviceCostsBook::Create("");
    jobs_.options().final_report_wait = absl::Milliseconds(100);
    jobs_.options().device_costs = book_.get();
    ASSERT_EQ(jobs_.Start(), absl::OkStatus());
  }
  void TearDown() override { jobs_.Stop(); }

  fitrun::v1::WorkerAssignment AssignmentOf(const WorkerLaunch& launch) {
    const std::map<std::string, std::string> env(launch.env.begin(), launch.env.end());
    std::stringstream text;
    text << std::ifstream(env.at("FITRUN_ASSIGNMENT")).rdbuf();
    fitrun::v1::WorkerAssignment assignment;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text.str(), &assignment));
    return assignment;
  }

  std::unique_ptr<DeviceCostsBook> book_;
  TestJobManager jobs_;  // after the book its options point to
};

TEST_F(JobManagerGpuTest, APlanOnAGpuCountsTheProcessBeyondItsTensorsAndTheRanksGetTheAllocatorSettings) {
  Start(FakeDeviceInventory::Gpus(2, 80 * kGiB, kH100));
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec("gpu", 256, 10, 2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  const fitrun::v1::Job running = WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_RUNNING);
  const fitrun::v1::MemoryBreakdown& predicted = running.plan().predicted();
  EXPECT_EQ(predicted.cuda_context_bytes(), static_cast<int64_t>(std::ceil(527 * kMiB * kUnmeasuredModelMargin)));
  EXPECT_EQ(predicted.communication_bytes(), static_cast<int64_t>(std::ceil(560 * kMiB * kUnmeasuredModelMargin)));
  EXPECT_GE(predicted.allocator_reserve_bytes(), 88 * kMiB);
  EXPECT_EQ(running.plan().cuda_allocator_config(), "expandable_segments:True");
  EXPECT_THAT(absl::StrJoin(running.plan().reasons(), "\n"), HasSubstr("the CUDA context 553.4 MiB"));
  for (const WorkerLaunch& launch : jobs_.launcher().launches()) {
    const std::map<std::string, std::string> env(launch.env.begin(), launch.env.end());
    EXPECT_EQ(env.at("PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:True");
    EXPECT_EQ(AssignmentOf(launch).memory_cap_bytes(launch.rank), 0) << "a whole GPU is its own limit";
  }
}

TEST_F(JobManagerGpuTest, ASlicesRanksAreCappedToTheSliceAndItsPlanHoldsTheAllocatorAlone) {
  // Two slices of one GPU: a job each.
  Start(FakeDeviceInventory::Gpus(2, 80 * kGiB, kH100, /*slice_bytes=*/kGiB));
  for (const char* name : {"slice-a", "slice-b"}) {
    absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec(name, 256, 10, 1, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_RUNNING);
  }
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(2, absl::Seconds(5)));
  const fitrun::v1::Job running = *jobs_.manager().Get(jobs_.launcher().launches()[0].job_id);
  EXPECT_EQ(running.plan().device_ids(0), "cuda:0#0");
  EXPECT_EQ(jobs_.manager().Get(jobs_.launcher().launches()[1].job_id)->plan().device_ids(0), "cuda:0#1");
  EXPECT_LE(running.plan().predicted().allocator_bytes(), kGiB);
  EXPECT_GT(running.plan().predicted().total_bytes(), kGiB) << "the context lies outside the slice";
  EXPECT_THAT(absl::StrJoin(running.plan().reasons(), "\n"), HasSubstr("the slice's cap binds the allocator alone"));
  for (const WorkerLaunch& launch : jobs_.launcher().launches()) {
    EXPECT_EQ(AssignmentOf(launch).memory_cap_bytes(launch.rank), kGiB);
  }
}

TEST_F(JobManagerGpuTest, TwoRanksOfAJobOnOneGpuAreRefusedAtSubmitNamingWhy) {
  // NCCL refuses two ranks on one GPU and the CUDA worker has no Gloo: a plan never puts them there.
  Start(FakeDeviceInventory::Gpus(2, 80 * kGiB, kH100, /*slice_bytes=*/kGiB));
  const absl::Status refused = jobs_.manager().Submit(MlpSpec("two-on-one", 256, 10, 2, 2)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("spec.resources.min_devices"));
  EXPECT_THAT(refused.message(), HasSubstr("one rank per GPU"));
  EXPECT_THAT(refused.message(), HasSubstr("NCCL refuses them"));
  // Up to two devices allowed: it takes one slice.
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec("one-of-two", 256, 10, 1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_RUNNING).plan().device_ids_size(), 1);
}

TEST_F(JobManagerGpuTest, Fp16IsPlannedOnGpus) {
  Start(FakeDeviceInventory::Gpus(1, 80 * kGiB, kH100));
  fitrun::v1::JobSpec spec = MlpSpec("fp16", 256, 10, 1, 1);
  spec.set_precision(fitrun::v1::PRECISION_FP16);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerGpuTest, Fp16IsRefusedOnCpusNamingWhy) {
  Start(FakeDeviceInventory(2, 4 * kGiB));
  fitrun::v1::JobSpec spec = MlpSpec("fp16", 256, 10, 1, 1);
  spec.set_precision(fitrun::v1::PRECISION_FP16);
  const absl::Status refused = jobs_.manager().Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("spec.precision: fp16 needs CUDA devices"));
  EXPECT_THAT(refused.message(), HasSubstr("use bf16"));
}

TEST_F(JobManagerGpuTest, AHostMemoryOomOnAGpuFailsNamingTheHostMemoryToRaise) {
  Start(FakeDeviceInventory::Gpus(1, 80 * kGiB, kH100));
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec("gpu-host-oom", 256, 10, 1, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(1, absl::Seconds(5)));
  WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(jobs_.launcher().attempts().size(), 1u);
  EXPECT_EQ(jobs_.launcher().attempts()[0].host_memory_limit_bytes, 4 * kGiB)
      << "a rank on a GPU gets 4 GiB of host memory";
  WorkerExit exit;
  exit.exit_code = -1;
  exit.signal = 9;
  exit.host_memory_oom = true;
  exit.host_memory_limit_bytes = 4 * kGiB;
  jobs_.launcher().ExitWith(0, exit);
  // The batch lives on the GPU: a smaller one would not need less host memory.
  const fitrun::v1::Job failed = WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("host memory limit of 4.00 GiB"));
  EXPECT_THAT(failed.failure_reason(),
              HasSubstr("on a GPU a rank's host memory does not shrink with its per-device batch; raise "
                        "spec.resources.host_memory (each rank may use 4.00 GiB now, the default)"));
  EXPECT_EQ(failed.oom_replans(), 0);
}

TEST_F(JobManagerGpuTest, AScriptsOwnAllocatorSettingsArePlannedWith) {
  Start(FakeDeviceInventory::Gpus(1, 80 * kGiB, kH100));
  fitrun::v1::JobSpec spec;
  spec.set_name("script");
  spec.mutable_script()->add_command("/bin/true");
  spec.mutable_script()->set_working_dir("/tmp");
  (*spec.mutable_script()->mutable_env())["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:128";
  spec.mutable_resources()->set_per_device_batch(8);
  spec.set_global_batch_size(8);
  spec.set_max_steps(5);
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> planned = jobs_.manager().DryRunPlan(spec);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->second.cuda_allocator_config(), "max_split_size_mb:128");
  // Nothing has measured the script: its run does, with those settings.
  EXPECT_THAT(absl::StrJoin(planned->second.reasons(), "\n"), HasSubstr("no peak is predicted"));
  EXPECT_EQ(planned->second.predicted().total_bytes(), 0);
}

TEST_F(JobManagerGpuTest, ARunsPeaksAreKeptAndCorrectTheNextPlanOnThatGpuModel) {
  Start(FakeDeviceInventory::Gpus(1, 80 * kGiB, kH100));
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(MlpSpec("learn", 64, 10, 1, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(1, absl::Seconds(5)));
  WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_RUNNING);
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(10);
  progress.mutable_progress()->set_peak_bytes(100 * kMiB);
  progress.mutable_progress()->set_reserved_peak_bytes(110 * kMiB);
  progress.mutable_progress()->set_device_peak_bytes(1000 * kMiB);
  jobs_.manager().OnWorkerReport(WorkerKey{job->id(), 1, 0}, progress);
  fitrun::v1::WorkerReport finished;
  finished.mutable_finished()->set_steps(10);
  jobs_.manager().OnWorkerReport(WorkerKey{job->id(), 1, 0}, finished);
  jobs_.launcher().Exit(0, 0);
  const fitrun::v1::Job done = WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
  // Released after the ranks exit: wait until the attempt's record has its peaks.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  fitrun::v1::Job ended = done;
  while (ended.attempt_history(0).measured_device_peak_bytes() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    ended = *jobs_.manager().Get(job->id());
  }
  EXPECT_EQ(ended.attempt_history(0).measured_peak_bytes(), 100 * kMiB);
  EXPECT_EQ(ended.attempt_history(0).measured_reserved_peak_bytes(), 110 * kMiB);
  EXPECT_EQ(ended.attempt_history(0).measured_device_peak_bytes(), 1000 * kMiB);
  const DeviceCosts learned = book_->CostsFor("", kH100, "expandable_segments:True");
  EXPECT_NEAR(learned.reserve_ratio, 1.1 * 1.03, 1e-9);
  absl::StatusOr<std::pair<fitrun::v1::JobSpec, fitrun::v1::Plan>> next =
      jobs_.manager().DryRunPlan(MlpSpec("next", 64, 10, 1, 1));
  ASSERT_TRUE(next.ok());
  EXPECT_THAT(absl::StrJoin(next->second.reasons(), "\n"), HasSubstr("1 run(s) on NVIDIA H100 80GB HBM3"));
}

// An unchanged script on a GPU reports nothing: its supervisor's NVML sample of its footprint is
// the one figure, and the attempt learns the allocator's bytes it stands for (the footprint less the
// GPU model's costs outside the allocator, over its reserve), not the costs from a figure they made.
TEST_F(JobManagerGpuTest, AScriptThatReportsNothingIsMeasuredByItsFootprint) {
  Start(FakeDeviceInventory::Gpus(1, 80 * kGiB, kH100));
  const std::filesystem::path dir = jobs_.state_dir() / "script";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "train.py") << "print('training')\n";
  fitrun::v1::JobSpec spec;
  spec.set_name("unchanged");
  spec.mutable_script()->add_command("/usr/bin/python3");
  spec.mutable_script()->add_command("train.py");
  spec.mutable_script()->set_working_dir(dir.string());
  spec.set_global_batch_size(8);
  absl::StatusOr<fitrun::v1::Job> job = jobs_.manager().Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.launcher().WaitForLaunches(1, absl::Seconds(5)));
  WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_RUNNING);
  const DeviceCosts costs = book_->CostsFor("", kH100, "expandable_segments:True");
  const int64_t allocated = 2 * kGiB;
  const int64_t footprint =
      costs.outside_allocator_bytes() + static_cast<int64_t>(static_cast<double>(allocated) * costs.reserve_ratio);
  fitrun::v1::WorkerReport finished;
  finished.mutable_finished()->set_device_peak_bytes(footprint);
  jobs_.manager().OnWorkerReport(WorkerKey{job->id(), 1, 0}, finished);
  jobs_.launcher().Exit(0, 0);
  WaitForState(jobs_.manager(), job->id(), fitrun::v1::JOB_STATE_SUCCEEDED);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  fitrun::v1::Job ended = *jobs_.manager().Get(job->id());
  while (ended.attempt_history(0).measured_peak_bytes() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    ended = *jobs_.manager().Get(job->id());
  }
  EXPECT_NEAR(ended.attempt_history(0).measured_peak_bytes(), allocated, 1024);
  EXPECT_EQ(ended.attempt_history(0).measured_device_peak_bytes(), footprint);
  EXPECT_NEAR(book_->CostsFor("", kH100, "expandable_segments:True").reserve_ratio, costs.reserve_ratio, 1e-9)
      << "nothing learnt about the costs from a figure derived with them";
}

}  // namespace
}  // namespace fitrun::server
