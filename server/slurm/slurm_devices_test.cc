#include "server/slurm/slurm_devices.h"
#include "server/slurm/recorded_output.h"


#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/contract/log.h"

namespace fitrun::server::slurm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// What Slurm 22.05's scontrol says when slurmctld is not running, as RunSlurmCommand reports it.
const absl::Status kControllerDown = absl::UnavailableError(
    "`scontrol show node --oneliner` exited with status 1: slurm_load_node error: Unable to contact slurm "
    "controller (connect failure)");

// A scontrol that answers with whatever the test set last, and counts its calls.
class FakeScontrol {
 public:
  explicit FakeScontrol(std::string output) : output_(std::move(output)) {}

  SlurmRunner Runner() {
    return [this](const std::vector<std::string>& argv) -> absl::StatusOr<std::string> {
      absl::MutexLock lock(&mu_);
      ++calls_;
      last_argv_ = argv;
      if (!error_.ok()) return error_;
      return output_;
    };
  }

  void Answer(std::string output) {
    absl::MutexLock lock(&mu_);
    output_ = std::move(output);
    error_ = absl::OkStatus();
  }
  void Fail(absl::Status error) {
    absl::MutexLock lock(&mu_);
    error_ = std::move(error);
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<std::string> last_argv() {
    absl::MutexLock lock(&mu_);
    return last_argv_;
  }

  // Waits until `count` calls have started. Calls come one after another from one refresh thread, so
  // once call N+1 has started, the answer to call N has been taken in.
  bool AwaitCalls(int count) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }
  // Waits until two more refreshes have taken in what the test set before this call.
  bool AwaitTwoMoreRefreshes() { return AwaitCalls(calls() + 3); }

 private:
  absl::Mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> last_argv_ ABSL_GUARDED_BY(mu_);
};

std::vector<std::string> Ids(const std::vector<fitrun::v1::Device>& devices) {
  std::vector<std::string> ids;
  for (const fitrun::v1::Device& device : devices) ids.push_back(device.id());
  return ids;
}

SlurmDevices::Options OptionsWith(FakeScontrol& scontrol) {
  SlurmDevices::Options options;
  options.runner = scontrol.Runner();
  options.refresh_interval = absl::Hours(1);  // Tests of refreshing set a short one.
  return options;
}

TEST(SlurmDevicesTest, GpusOfEveryNodeWithTheTablesMemory) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"fake", 16 * kGiB}, {"a100", 80 * kGiB}};
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(scontrol.last_argv(), ElementsAre("scontrol", "show", "node", "--oneliner"));

  const std::vector<fitrun::v1::Device> snapshot = (*devices)->Snapshot();
  EXPECT_THAT(Ids(snapshot), ElementsAre("n1/cuda:0", "n1/cuda:1", "n2/cuda:0", "n2/cuda:1"));
  for (const fitrun::v1::Device& device : snapshot) {
    EXPECT_EQ(device.kind(), fitrun::v1::DEVICE_KIND_CUDA);
    EXPECT_EQ(device.name(), "fake");
    EXPECT_EQ(device.total_bytes(), 16 * kGiB);
    EXPECT_EQ(device.free_bytes(), 16 * kGiB);
    EXPECT_EQ(device.cpu_threads(), 1);  // 2 CPUs shared by 2 GPUs
    EXPECT_EQ(device.node(), device.id().substr(0, 2));
  }
}

TEST(SlurmDevicesTest, GpusOfSeveralTypesAreNumberedAcrossTypesAndShareTheCpus) {
  FakeScontrol scontrol(
      "NodeName=g1 State=MIXED CPUTot=32 Gres=gpu:a100:2(S:0),gpu:t4:2(S:1),shard:8 Partitions=gpu\n"
      "NodeName=g2 State=IDLE CPUTot=4 Gres=gpu:8 Partitions=gpu\n");
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"a100", 80 * kGiB}, {"t4", 16 * kGiB}, {"gpu", 24 * kGiB}};
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  const std::vector<fitrun::v1::Device> snapshot = (*devices)->Snapshot();
  ASSERT_EQ(snapshot.size(), 12u);
  EXPECT_EQ(snapshot[1].id(), "g1/cuda:1");
  EXPECT_EQ(snapshot[1].name(), "a100");
  EXPECT_EQ(snapshot[1].total_bytes(), 80 * kGiB);
  EXPECT_EQ(snapshot[2].id(), "g1/cuda:2");
  EXPECT_EQ(snapshot[2].name(), "t4");
  EXPECT_EQ(snapshot[2].total_bytes(), 16 * kGiB);
  EXPECT_EQ(snapshot[2].cpu_threads(), 8);  // 32 CPUs / 4 GPUs
  EXPECT_EQ(snapshot[11].id(), "g2/cuda:7");
  EXPECT_EQ(snapshot[11].name(), "gpu");   // untyped
  EXPECT_EQ(snapshot[11].cpu_threads(), 1);  // 4 CPUs / 8 GPUs, at least 1
}

TEST(SlurmDevicesTest, VirtualDevicesPerNodeWithoutGpus) {
  FakeScontrol scontrol(Sample("scontrol_show_node_no_gres.txt") + "NodeName=big State=IDLE CPUTot=8\n");
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.virtual_devices = std::make_pair(2, kGiB);
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  const std::vector<fitrun::v1::Device> snapshot = (*devices)->Snapshot();
  EXPECT_THAT(Ids(snapshot), ElementsAre("n1/cpu:0", "n1/cpu:1", "big/cpu:0", "big/cpu:1"));
  for (const fitrun::v1::Device& device : snapshot) {
    EXPECT_EQ(device.kind(), fitrun::v1::DEVICE_KIND_CPU);
    EXPECT_EQ(device.total_bytes(), kGiB);
    EXPECT_EQ(device.free_bytes(), kGiB);
  }
  EXPECT_EQ(snapshot[0].node(), "n1");
  EXPECT_EQ(snapshot[0].cpu_threads(), 1);  // 2 CPUs / 2 devices
  EXPECT_EQ(snapshot[2].node(), "big");
  EXPECT_EQ(snapshot[2].cpu_threads(), 4);  // 8 CPUs / 2 devices
}

TEST(SlurmDevicesTest, VirtualDevicesWinOverGpusAndNeedNoMemoryTable) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.virtual_devices = std::make_pair(3, 2 * kGiB);
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  const std::vector<fitrun::v1::Device> snapshot = (*devices)->Snapshot();
  EXPECT_THAT(Ids(snapshot), ElementsAre("n1/cpu:0", "n1/cpu:1", "n1/cpu:2", "n2/cpu:0", "n2/cpu:1", "n2/cpu:2"));
  EXPECT_EQ(snapshot[0].cpu_threads(), 1);  // 2 CPUs / 3 devices, at least 1
}

TEST(SlurmDevicesTest, PartitionKeepsOnlyItsNodes) {
  const std::string nodes =
      "NodeName=a1 State=IDLE CPUTot=4 Partitions=gpu,debug Gres=gpu:t4:1\n"
      "NodeName=a2 State=IDLE CPUTot=4 Partitions=debug Gres=gpu:t4:1\n"
      "NodeName=a3 State=IDLE CPUTot=4 Gres=gpu:t4:1\n";
  FakeScontrol scontrol(nodes);
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"t4", 16 * kGiB}};
  options.partition = "gpu";
  absl::StatusOr<std::unique_ptr<SlurmDevices>> gpu_partition = SlurmDevices::Create(options);
  ASSERT_TRUE(gpu_partition.ok()) << gpu_partition.status();
  EXPECT_THAT(Ids((*gpu_partition)->Snapshot()), ElementsAre("a1/cuda:0"));
  // Addresses are known for every node, in the partition or not.
  EXPECT_EQ((*gpu_partition)->NodeAddress("a3"), "a3");

  options.partition = "";
  absl::StatusOr<std::unique_ptr<SlurmDevices>> all = SlurmDevices::Create(options);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Ids((*all)->Snapshot()), ElementsAre("a1/cuda:0", "a2/cuda:0", "a3/cuda:0"));

  options.partition = "nope";
  absl::StatusOr<std::unique_ptr<SlurmDevices>> none = SlurmDevices::Create(options);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("a1 (not in partition 'nope')"));
}

TEST(SlurmDevicesTest, UnusableNodesGiveNoDevices) {
  FakeScontrol scontrol(Sample("scontrol_show_node_down.txt"));  // n2 DOWN+DRAIN
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"fake", 16 * kGiB}};
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(Ids((*devices)->Snapshot()), ElementsAre("n1/cuda:0", "n1/cuda:1"));
  EXPECT_EQ((*devices)->NodeAddress("n2"), "127.0.0.3");  // still listed, only not usable

  FakeScontrol odd("NodeName=d1 State=DOWN* CPUTot=2 Gres=gpu:h100:4\n"
                   "NodeName=d2 State=IDLE+DRAIN CPUTot=2 Gres=gpu:h100:4\n"
                   "NodeName=d3 State=MIXED CPUTot=2 Gres=gpu:fake:1\n");
  SlurmDevices::Options odd_options = OptionsWith(odd);
  odd_options.gpu_memory = {{"fake", 16 * kGiB}};  // h100 is only on unusable nodes: no size needed
  absl::StatusOr<std::unique_ptr<SlurmDevices>> odd_devices = SlurmDevices::Create(odd_options);
  ASSERT_TRUE(odd_devices.ok()) << odd_devices.status();
  EXPECT_THAT(Ids((*odd_devices)->Snapshot()), ElementsAre("d3/cuda:0"));
}

TEST(SlurmDevicesTest, MissingGpuTypeIsAnErrorNamingTheFlagTypeAndNode) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"a100", 80 * kGiB}};
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(devices.status().message(),
            "--slurm_gpu_memory: no memory size for GPU type 'fake' on node n1; add fake=<size>, e.g. "
            "--slurm_gpu_memory=fake=80GiB");

  FakeScontrol untyped("NodeName=u1 State=IDLE CPUTot=2 Gres=gpu:2\nNodeName=u2 State=IDLE CPUTot=2 Gres=gpu:v100:1\n");
  options.runner = untyped.Runner();
  options.gpu_memory = {};
  devices = SlurmDevices::Create(options);
  ASSERT_FALSE(devices.ok());
  EXPECT_THAT(devices.status().message(), HasSubstr("GPU type 'gpu' (untyped, Gres=gpu:N) on node u1, nor 'v100' on "
                                                    "node u2; add gpu=<size>,v100=<size>"));
}

TEST(SlurmDevicesTest, RunnerFailureAtCreateIsUnavailableWithTheFix) {
  FakeScontrol scontrol("");
  scontrol.Fail(kControllerDown);
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(OptionsWith(scontrol));
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(devices.status().message(), HasSubstr("cannot reach slurmctld: `scontrol show node --oneliner` exited "
                                                    "with status 1: slurm_load_node error: Unable to contact slurm "
                                                    "controller (connect failure)"));
  EXPECT_THAT(devices.status().message(), HasSubstr("check that slurmctld runs and that SLURM_CONF"));

  scontrol.Fail(absl::NotFoundError("scontrol: not found on PATH"));
  devices = SlurmDevices::Create(OptionsWith(scontrol));
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(devices.status().message(), HasSubstr("scontrol: not found on PATH"));
}

TEST(SlurmDevicesTest, NoUsableDeviceIsFailedPreconditionNamingEveryNodeAndWhy) {
  FakeScontrol no_gpus(Sample("scontrol_show_node_no_gres.txt"));
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(OptionsWith(no_gpus));
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(devices.status().message(),
            "slurm inventory: none of the 1 nodes gives a device: n1 (no GPUs in Gres); pass "
            "--slurm_virtual_devices=2x4GiB for CPU devices");

  FakeScontrol all_down("NodeName=n1 State=DOWN* CPUTot=2 Gres=gpu:t4:1\nNodeName=n2 State=IDLE+DRAIN CPUTot=2\n");
  SlurmDevices::Options options = OptionsWith(all_down);
  options.gpu_memory = {{"t4", 16 * kGiB}};
  devices = SlurmDevices::Create(options);
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(devices.status().message(), HasSubstr("n1 (State=DOWN*), n2 (State=IDLE+DRAIN)"));
  EXPECT_THAT(devices.status().message(), HasSubstr("state=resume"));

  FakeScontrol empty("No nodes in the system\n");
  devices = SlurmDevices::Create(OptionsWith(empty));
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(devices.status().message(), HasSubstr("lists no nodes"));
}

TEST(SlurmDevicesTest, UnreadableOutputAtCreateIsAnErrorNamingTheLine) {
  FakeScontrol scontrol("NodeName=n1 State=IDLE CPUTot=2\nsomething else entirely\n");
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(OptionsWith(scontrol));
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(devices.status().message(), HasSubstr("line 2: no NodeName="));
}

TEST(SlurmDevicesTest, NodeAddressOfListedNodesOnly) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"fake", 16 * kGiB}};
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_EQ((*devices)->NodeAddress("n1"), "127.0.0.2");
  EXPECT_EQ((*devices)->NodeAddress("n2"), "127.0.0.3");
  EXPECT_EQ((*devices)->NodeAddress("n9"), std::nullopt);
}

TEST(SlurmDevicesTest, RefreshFollowsDrainAndResume) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"fake", 16 * kGiB}};
  options.refresh_interval = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(Ids((*devices)->Snapshot()), ElementsAre("n1/cuda:0", "n1/cuda:1", "n2/cuda:0", "n2/cuda:1"));

  scontrol.Answer(Sample("scontrol_show_node_drain.txt"));
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());
  EXPECT_THAT(Ids((*devices)->Snapshot()), ElementsAre("n1/cuda:0", "n1/cuda:1"));

  scontrol.Answer(Sample("scontrol_show_node_gpus.txt"));
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());
  EXPECT_THAT(Ids((*devices)->Snapshot()), ElementsAre("n1/cuda:0", "n1/cuda:1", "n2/cuda:0", "n2/cuda:1"));
}

TEST(SlurmDevicesTest, FailingRefreshKeepsTheLastListAndLogsOnce) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"fake", 16 * kGiB}};
  options.refresh_interval = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  const std::vector<std::string> before = Ids((*devices)->Snapshot());
  ASSERT_EQ(before.size(), 4u);

  contract::SetLogProgramName("fitrund");  // the name fitrund's log lines carry
  testing::internal::CaptureStderr();
  scontrol.Fail(kControllerDown);
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());  // four failed refreshes at least
  EXPECT_EQ(Ids((*devices)->Snapshot()), before);
  EXPECT_EQ((*devices)->NodeAddress("n2"), "127.0.0.3");

  scontrol.Answer("NodeName=n1 State=IDLE CPUTot=2\ngarbage line\n");  // unreadable: kept as well
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());
  EXPECT_EQ(Ids((*devices)->Snapshot()), before);

  scontrol.Answer(Sample("scontrol_show_node_drain.txt"));
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());
  EXPECT_THAT(Ids((*devices)->Snapshot()), ElementsAre("n1/cuda:0", "n1/cuda:1"));
  devices->reset();
  const std::string log = testing::internal::GetCapturedStderr();

  const std::string down_line =
      "fitrund: slurm inventory: `scontrol show node --oneliner` exited with status 1: slurm_load_node error: "
      "Unable to contact slurm controller (connect failure); keeping the last list\n";
  EXPECT_THAT(log, HasSubstr(down_line));
  EXPECT_EQ(log.find(down_line), log.rfind(down_line)) << "logged more than once:\n" << log;
  EXPECT_THAT(log, HasSubstr("fitrund: slurm inventory: cannot read Slurm's node list: scontrol show node: line 2: "
                             "no NodeName= in 'garbage line'; keeping the last list\n"));
  EXPECT_THAT(log, HasSubstr("fitrund: slurm inventory: scontrol answers again\n"));
}

TEST(SlurmDevicesTest, NodeWithANewGpuTypeOnRefreshIsLeftOutAndLoggedOnce) {
  FakeScontrol scontrol("NodeName=n1 State=IDLE CPUTot=2 Gres=gpu:t4:1\n");
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"t4", 16 * kGiB}};
  options.refresh_interval = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();

  contract::SetLogProgramName("fitrund");  // the name fitrund's log lines carry
  testing::internal::CaptureStderr();
  scontrol.Answer("NodeName=n1 State=IDLE CPUTot=2 Gres=gpu:t4:1\nNodeName=n2 State=IDLE CPUTot=2 Gres=gpu:h100:2\n");
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());
  ASSERT_TRUE(scontrol.AwaitTwoMoreRefreshes());
  EXPECT_THAT(Ids((*devices)->Snapshot()), ElementsAre("n1/cuda:0"));
  EXPECT_EQ((*devices)->NodeAddress("n2"), "n2");  // the listing itself was taken in
  devices->reset();
  const std::string log = testing::internal::GetCapturedStderr();
  const std::string line = "fitrund: slurm inventory: node n2 left out: no memory size for its GPU type 'h100' "
                           "(add h100=<size> to --slurm_gpu_memory)\n";
  EXPECT_THAT(log, HasSubstr(line));
  EXPECT_EQ(log.find(line), log.rfind(line)) << log;
}

TEST(SlurmDevicesTest, SnapshotDoesNotWaitForACommandInFlight) {
  // A runner that blocks until the test lets it go, as a hung slurmctld would.
  absl::Mutex mu;
  bool release = false;
  int calls = 0;
  SlurmDevices::Options options;
  options.gpu_memory = {{"fake", 16 * kGiB}};
  options.refresh_interval = absl::Milliseconds(1);
  const std::string sample = Sample("scontrol_show_node_gpus.txt");
  options.runner = [&](const std::vector<std::string>&) -> absl::StatusOr<std::string> {
    absl::MutexLock lock(&mu);
    if (++calls > 1) mu.Await(absl::Condition(&release));
    return sample;
  };
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  {
    absl::MutexLock lock(&mu);
    auto blocked = [&calls]() { return calls >= 2; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&blocked), absl::Seconds(30)));
  }
  // The refresh thread is inside the runner now.
  EXPECT_EQ((*devices)->Snapshot().size(), 4u);
  EXPECT_EQ((*devices)->NodeAddress("n1"), "127.0.0.2");
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  devices->reset();
}

TEST(SlurmDevicesTest, DestructorStopsAWaitingRefreshThreadAtOnce) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.gpu_memory = {{"fake", 16 * kGiB}};
  options.refresh_interval = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<SlurmDevices>> devices = SlurmDevices::Create(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  const absl::Time start = absl::Now();
  devices->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(scontrol.calls(), 1);  // the listing in Create only
}

TEST(SlurmDevicesTest, BadOptionsAreRejected) {
  FakeScontrol scontrol(Sample("scontrol_show_node_gpus.txt"));
  SlurmDevices::Options options = OptionsWith(scontrol);
  options.refresh_interval = absl::ZeroDuration();
  EXPECT_EQ(SlurmDevices::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = OptionsWith(scontrol);
  options.virtual_devices = std::make_pair(0, kGiB);
  EXPECT_THAT(SlurmDevices::Create(options).status().message(), HasSubstr("--slurm_virtual_devices"));
  EXPECT_EQ(scontrol.calls(), 0);
}

}  // namespace
}  // namespace fitrun::server::slurm
