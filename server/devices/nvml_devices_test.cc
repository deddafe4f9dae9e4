#include "server/devices/nvml_devices.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

std::string FakeLibraryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "fitrun",
                      "/server/devices/testdata/libfake_nvml.so");
}

// Holds the fake library open so its controls can be reached; NvmlDevices's own dlopen of the same
// path gets this same copy, so the controls steer what it reads.
class NvmlDevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    library_ = dlopen(FakeLibraryPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << dlerror();
    reset_ = Control<void (*)()>("FakeNvmlReset");
    set_init_result_ = Control<void (*)(int)>("FakeNvmlSetInitResult");
    set_memory_info_result_ = Control<void (*)(int)>("FakeNvmlSetMemoryInfoResult");
    set_free_bytes_ = Control<void (*)(unsigned int, unsigned long long)>("FakeNvmlSetFreeBytes");
    is_initialized_ = Control<int (*)()>("FakeNvmlIsInitialized");
    ASSERT_TRUE(reset_ && set_init_result_ && set_memory_info_result_ && set_free_bytes_ && is_initialized_);
    reset_();
  }
  void TearDown() override {
    if (library_ != nullptr) dlclose(library_);
  }

  template <typename Fn>
  Fn Control(const char* name) {
    return reinterpret_cast<Fn>(dlsym(library_, name));
  }

  absl::StatusOr<std::unique_ptr<NvmlDevices>> CreateOverFake() {
    NvmlDevices::Options options;
    options.library_path = FakeLibraryPath();
    return NvmlDevices::Create(options);
  }

  void* library_ = nullptr;
  void (*reset_)() = nullptr;
  void (*set_init_result_)(int) = nullptr;
  void (*set_memory_info_result_)(int) = nullptr;
  void (*set_free_bytes_)(unsigned int, unsigned long long) = nullptr;
  int (*is_initialized_)() = nullptr;
};

TEST_F(NvmlDevicesTest, ReportsEachDeviceWithTheDriversFigures) {
  auto nvml = CreateOverFake();
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  std::vector<fitrun::v1::Device> devices = (*nvml)->Snapshot();
  ASSERT_EQ(devices.size(), 2u);

  EXPECT_EQ(devices[0].id(), "cuda:0");
  EXPECT_EQ(devices[0].kind(), fitrun::v1::DEVICE_KIND_CUDA);
  EXPECT_EQ(devices[0].name(), "Fake GPU A100-SXM4-40GB");
  EXPECT_EQ(devices[0].uuid(), "GPU-00000000-1111-2222-3333-444444444444");
  EXPECT_EQ(devices[0].total_bytes(), 40LL << 30);
  EXPECT_EQ(devices[0].free_bytes(), 39LL << 30);
  EXPECT_EQ(devices[0].used_bytes(), 1LL << 30);
  EXPECT_DOUBLE_EQ(devices[0].utilization(), 0.0);
  EXPECT_TRUE(devices[0].job_id().empty());

  EXPECT_EQ(devices[1].id(), "cuda:1");
  EXPECT_EQ(devices[1].kind(), fitrun::v1::DEVICE_KIND_CUDA);
  EXPECT_EQ(devices[1].name(), "Fake GPU A100-SXM4-80GB");
  EXPECT_EQ(devices[1].uuid(), "GPU-55555555-6666-7777-8888-999999999999");
  EXPECT_EQ(devices[1].total_bytes(), 80LL << 30);
  EXPECT_EQ(devices[1].free_bytes(), 60LL << 30);
  EXPECT_EQ(devices[1].used_bytes(), 20LL << 30);
  EXPECT_DOUBLE_EQ(devices[1].utilization(), 0.35);
}

TEST_F(NvmlDevicesTest, EachSnapshotReadsFreshFigures) {
  auto nvml = CreateOverFake();
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  ASSERT_EQ((*nvml)->Snapshot()[1].free_bytes(), 60LL << 30);

  set_free_bytes_(1, 10LL << 30);
  std::vector<fitrun::v1::Device> devices = (*nvml)->Snapshot();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1].free_bytes(), 10LL << 30);
  EXPECT_EQ(devices[1].used_bytes(), 70LL << 30);
  EXPECT_EQ(devices[0].free_bytes(), 39LL << 30);
}

TEST_F(NvmlDevicesTest, FailedRefreshKeepsTheLastFigures) {
  auto nvml = CreateOverFake();
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  set_free_bytes_(0, 5LL << 30);
  set_memory_info_result_(999);
  std::vector<fitrun::v1::Device> devices = (*nvml)->Snapshot();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].free_bytes(), 39LL << 30);
  EXPECT_EQ(devices[0].name(), "Fake GPU A100-SXM4-40GB");
}

TEST_F(NvmlDevicesTest, DestructionShutsNvmlDown) {
  {
    auto nvml = CreateOverFake();
    ASSERT_TRUE(nvml.ok()) << nvml.status();
    EXPECT_EQ(is_initialized_(), 1);
  }
  EXPECT_EQ(is_initialized_(), 0);
}

TEST_F(NvmlDevicesTest, MissingLibraryIsNotFound) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  NvmlDevices::Options options;
  options.library_path = dir.Join("no-such-dir/libnvidia-ml.so.1");
  auto nvml = NvmlDevices::Create(options);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound) << nvml.status();
  EXPECT_THAT(nvml.status().message(), HasSubstr(options.library_path));
}

TEST_F(NvmlDevicesTest, FailingInitNamesTheCallAndTheReason) {
  set_init_result_(9);  // NVML_ERROR_DRIVER_NOT_LOADED
  auto nvml = CreateOverFake();
  ASSERT_FALSE(nvml.ok());
  EXPECT_NE(nvml.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(nvml.status().message(), HasSubstr("nvmlInit_v2"));
  EXPECT_THAT(nvml.status().message(), HasSubstr("Driver Not Loaded"));
}

TEST_F(NvmlDevicesTest, FailingDeviceQueryNamesTheCallAndShutsNvmlDown) {
  set_memory_info_result_(3);  // NVML_ERROR_NOT_SUPPORTED
  auto nvml = CreateOverFake();
  ASSERT_FALSE(nvml.ok());
  EXPECT_THAT(nvml.status().message(), HasSubstr("nvmlDeviceGetMemoryInfo(cuda:0)"));
  EXPECT_THAT(nvml.status().message(), HasSubstr("Not Supported"));
  EXPECT_EQ(is_initialized_(), 0);
}

}  // namespace
}  // namespace fitrun::server
