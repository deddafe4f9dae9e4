#include "worker/memory/process_gpu_memory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace fitrun::worker {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = 1LL << 30;
// The fake's two GPUs, as cudaDeviceGetPCIBusId names them (a 4-digit domain; NVML's own has 8).
constexpr char kGpu0[] = "0000:17:00.0";
constexpr char kGpu1[] = "0000:65:00.0";

std::string FakeLibraryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "fitrun",
                      "/worker/memory/testdata/libfake_nvml.so");
}

// Holds the fake library open so that its controls can be reached; NvmlProcessMemory's own dlopen of
// the same path gets this same copy.
class NvmlProcessMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    library_ = dlopen(FakeLibraryPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << dlerror();
    reset_ = reinterpret_cast<void (*)()>(dlsym(library_, "FakeNvmlReset"));
    add_process_ = reinterpret_cast<void (*)(unsigned, unsigned, unsigned long long)>(
        dlsym(library_, "FakeNvmlAddProcess"));
    is_initialized_ = reinterpret_cast<int (*)()>(dlsym(library_, "FakeNvmlIsInitialized"));
    ASSERT_TRUE(reset_ && add_process_ && is_initialized_);
    reset_();
  }
  void TearDown() override {
    if (library_ != nullptr) dlclose(library_);
  }

  std::unique_ptr<NvmlProcessMemory> Open() {
    absl::StatusOr<std::unique_ptr<NvmlProcessMemory>> nvml = NvmlProcessMemory::Create({FakeLibraryPath()});
    EXPECT_TRUE(nvml.ok()) << nvml.status();
    return nvml.ok() ? *std::move(nvml) : nullptr;
  }

  void* library_ = nullptr;
  void (*reset_)() = nullptr;
  void (*add_process_)(unsigned, unsigned, unsigned long long) = nullptr;
  int (*is_initialized_)() = nullptr;
};

// A shared GPU: this rank's figure is its own process's entry on its own GPU, neither the other
// processes' there nor its own on another GPU (a context a library opened on cuda:0, say).
TEST_F(NvmlProcessMemoryTest, ReadsThisProcessOnThisGpuOnly) {
  const unsigned self = static_cast<unsigned>(getpid());
  add_process_(0, self, 1 * kGiB);
  add_process_(0, self + 1, 5 * kGiB);
  add_process_(1, self + 1, 70 * kGiB);
  add_process_(1, self, 3 * kGiB);
  add_process_(1, self + 2, 2 * kGiB);
  std::unique_ptr<NvmlProcessMemory> nvml = Open();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(is_initialized_(), 1);
  EXPECT_EQ(*nvml->ProcessBytes(kGpu1, self), 3 * kGiB);
  EXPECT_EQ(*nvml->ProcessBytes(kGpu0, self), 1 * kGiB);
  EXPECT_EQ(*nvml->ProcessBytes("00000000:65:00.0", self + 1), 70 * kGiB);
  nvml.reset();
  EXPECT_EQ(is_initialized_(), 0) << "NVML must be shut down with the reader";
}

// The driver lists more processes than the first buffer holds: asked again with room for them.
TEST_F(NvmlProcessMemoryTest, ManyProcessesOnOneGpu) {
  for (unsigned pid = 1000; pid < 1200; ++pid) add_process_(1, pid, pid);
  std::unique_ptr<NvmlProcessMemory> nvml = Open();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(*nvml->ProcessBytes(kGpu1, 1199), 1199);
}

TEST_F(NvmlProcessMemoryTest, AProcessOrGpuNvmlDoesNotListIsAnError) {
  add_process_(0, 42, kGiB);
  std::unique_ptr<NvmlProcessMemory> nvml = Open();
  ASSERT_NE(nvml, nullptr);
  absl::StatusOr<int64_t> absent = nvml->ProcessBytes(kGpu1, 42);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound) << absent.status();
  EXPECT_THAT(absent.status().message(), HasSubstr("no process 42 on the GPU at 0000:65:00.0"));
  absl::StatusOr<int64_t> no_gpu = nvml->ProcessBytes("0000:b3:00.0", 42);
  EXPECT_FALSE(no_gpu.ok());
  EXPECT_THAT(no_gpu.status().message(), HasSubstr("nvmlDeviceGetHandleByPciBusId_v2(0000:b3:00.0) failed: Not Found"));
}

// fitrund's cuda:N is NVML's index N: a supervisor that knows no CUDA finds its script's GPU by it.
TEST_F(NvmlProcessMemoryTest, AGpuIsFoundByNvmlsIndexToo) {
  add_process_(1, 4242, 3 * kGiB);
  std::unique_ptr<NvmlProcessMemory> nvml = Open();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(*nvml->ProcessBytesAtIndex(1, 4242), 3 * kGiB);
  EXPECT_THAT(nvml->ProcessBytesAtIndex(0, 4242).status().message(), HasSubstr("no process 4242 on cuda:0"));
  EXPECT_FALSE(nvml->ProcessBytesAtIndex(7, 4242).ok());
}

// A script's footprint, sampled until stopped: the highest sample, missing ones (not on the GPU
// yet) adding nothing.
TEST_F(NvmlProcessMemoryTest, TheSamplerKeepsAProcesssHighestFootprint) {
  std::unique_ptr<NvmlProcessMemory> nvml = Open();
  ASSERT_NE(nvml, nullptr);
  ProcessFootprintSampler sampler(nvml.get(), 0, 5151, absl::Milliseconds(5));
  add_process_(0, 5151, 2 * kGiB);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (sampler.peak() < 2 * kGiB && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(sampler.peak(), 2 * kGiB) << "sampled while it runs";
  reset_();
  add_process_(0, 5151, 1 * kGiB);
  EXPECT_EQ(sampler.Stop(), 2 * kGiB);
  ProcessFootprintSampler never(nvml.get(), 0, 6161, absl::Milliseconds(5));
  EXPECT_EQ(never.Stop(), 0);
}

TEST(NvmlProcessMemoryCreateTest, NoDriverIsNotFound) {
  absl::StatusOr<std::unique_ptr<NvmlProcessMemory>> nvml = NvmlProcessMemory::Create({"/nonexistent/libnvidia-ml.so.1"});
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound) << nvml.status();
}

// Answers ProcessBytes from a queue of results.
class FakeReader final : public ProcessGpuMemoryReader {
 public:
  std::deque<absl::StatusOr<int64_t>> answers;
  std::string asked_bus_id;
  int64_t asked_pid = 0;
  absl::StatusOr<int64_t> ProcessBytes(const std::string& pci_bus_id, int64_t pid) override {
    asked_bus_id = pci_bus_id;
    asked_pid = pid;
    absl::StatusOr<int64_t> answer = answers.front();
    answers.pop_front();
    return answer;
  }
  absl::StatusOr<int64_t> ProcessBytesAtIndex(unsigned int nvml_index, int64_t pid) override {
    return ProcessBytes(absl::StrCat("index ", nvml_index), pid);
  }
};

TEST(DeviceMemoryGaugeTest, ThePeakIsTheHighestSampleOfTheProcessItself) {
  FakeReader reader;
  reader.answers = {2 * kGiB, 5 * kGiB, 3 * kGiB};
  int whole_device_reads = 0;
  DeviceMemoryGauge gauge(&reader, kGpu1, 4242, [&]() -> absl::StatusOr<int64_t> {
    ++whole_device_reads;
    return 79 * kGiB;
  });
  EXPECT_EQ(gauge.Sample(), 2 * kGiB);
  EXPECT_EQ(gauge.Sample(), 5 * kGiB);
  EXPECT_EQ(gauge.Sample(), 3 * kGiB);
  EXPECT_EQ(gauge.peak(), 5 * kGiB);
  EXPECT_EQ(reader.asked_bus_id, kGpu1);
  EXPECT_EQ(reader.asked_pid, 4242);
  EXPECT_EQ(whole_device_reads, 0);
  EXPECT_THAT(gauge.Describe(), HasSubstr("process 4242's own memory on the GPU at 0000:65:00.0 (NVML)"));
}

// Without NVML's figure the whole device's is used from then on, so one peak never mixes the two.
TEST(DeviceMemoryGaugeTest, FallsBackToTheWholeDeviceForGood) {
  FakeReader reader;
  reader.answers = {1 * kGiB, absl::NotFoundError("NVML lists no process 4242"), 9 * kGiB};
  DeviceMemoryGauge gauge(&reader, kGpu0, 4242, []() -> absl::StatusOr<int64_t> { return 6 * kGiB; });
  EXPECT_EQ(gauge.Sample(), 1 * kGiB);
  EXPECT_EQ(gauge.Sample(), 6 * kGiB);
  EXPECT_EQ(gauge.Sample(), 6 * kGiB);
  EXPECT_EQ(reader.answers.size(), 1u) << "the reader was asked again after it failed";
  EXPECT_EQ(gauge.peak(), 6 * kGiB);
  EXPECT_THAT(gauge.Describe(), HasSubstr("cudaMemGetInfo"));
  EXPECT_THAT(gauge.Describe(), HasSubstr("NVML lists no process 4242"));

  DeviceMemoryGauge without_nvml(nullptr, kGpu0, 4242, []() -> absl::StatusOr<int64_t> {
    return absl::InternalError("no CUDA");
  });
  EXPECT_EQ(without_nvml.Sample(), 0);
  EXPECT_THAT(without_nvml.Describe(), HasSubstr("NVML is not available"));
}

// The gauge over the real reader and the fake driver: this process's own figure on its own GPU.
TEST_F(NvmlProcessMemoryTest, TheGaugeReadsThisRanksOwnFootprint) {
  const unsigned self = static_cast<unsigned>(getpid());
  add_process_(1, self + 7, 40 * kGiB);
  add_process_(1, self, 2 * kGiB);
  std::unique_ptr<NvmlProcessMemory> nvml = Open();
  ASSERT_NE(nvml, nullptr);
  DeviceMemoryGauge gauge(nvml.get(), kGpu1, self, []() -> absl::StatusOr<int64_t> { return 42 * kGiB; });
  EXPECT_EQ(gauge.Sample(), 2 * kGiB);
  EXPECT_EQ(gauge.peak(), 2 * kGiB);
}

}  // namespace
}  // namespace fitrun::worker
