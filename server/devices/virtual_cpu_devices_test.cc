#include "server/devices/virtual_cpu_devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

TEST(VirtualCpuDevicesTest, ParsesCountAndSize) {
  auto devices = VirtualCpuDevices::Create("cpu:2x4GiB", /*cores=*/2, /*memory_bytes=*/24LL << 30);
  ASSERT_TRUE(devices.ok()) << devices.status();
  std::vector<fitrun::v1::Device> snapshot = (*devices)->Snapshot();
  ASSERT_EQ(snapshot.size(), 2u);
  EXPECT_EQ(snapshot[1].id(), "cpu:1");
  EXPECT_EQ(snapshot[0].total_bytes(), 4LL << 30);
  EXPECT_EQ(snapshot[0].free_bytes(), 4LL << 30);
  EXPECT_EQ(snapshot[0].cpu_threads(), 1);
  EXPECT_EQ(snapshot[0].kind(), fitrun::v1::DEVICE_KIND_CPU);
}

TEST(VirtualCpuDevicesTest, AutoGivesOneDevicePerCoreSharingHalfTheMemory) {
  auto devices = VirtualCpuDevices::Create("auto", 2, 24LL << 30);
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ((*devices)->Snapshot().size(), 2u);
  EXPECT_EQ((*devices)->Snapshot()[0].total_bytes(), 6LL << 30);
}

TEST(VirtualCpuDevicesTest, FractionalSizes) {
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3LL << 29);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512LL << 20);
}

TEST(VirtualCpuDevicesTest, BadFlagsNameTheFlagAndTheFormat) {
  for (const char* bad : {"gpu:2", "cpu:0x1GiB", "cpu:2x", "cpu:2x4GB", "cpu:twox4GiB"}) {
    auto devices = VirtualCpuDevices::Create(bad, 2, 1LL << 30);
    ASSERT_FALSE(devices.ok()) << bad;
    EXPECT_THAT(devices.status().message(), HasSubstr("--devices")) << bad;
  }
}

}  // namespace
}  // namespace fitrun::server
