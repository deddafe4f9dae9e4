#include "server/core/jobs/run_peaks.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace fitrun::server {
namespace {

fitrun::v1::Device Device(const std::string& id, fitrun::v1::DeviceKind kind, int64_t bytes) {
  fitrun::v1::Device device;
  device.set_id(id);
  device.set_kind(kind);
  device.set_total_bytes(bytes);
  return device;
}

ActiveAttempt AttemptOn(const std::vector<std::string>& device_ids, int64_t cgroup_peak) {
  ActiveAttempt attempt;
  attempt.device_ids = device_ids;
  attempt.ranks.resize(device_ids.size());
  attempt.ranks[0].exit.host_memory_peak_bytes = cgroup_peak;
  return attempt;
}

TEST(ImpossiblePeakTest, APeakBeyondTheAttemptsDeviceIsRefused) {
  const std::vector<fitrun::v1::Device> devices = {Device("cuda:0", fitrun::v1::DEVICE_KIND_CUDA, 80LL << 30),
                                                   Device("cuda:1", fitrun::v1::DEVICE_KIND_CUDA, 140LL << 30)};
  const ActiveAttempt attempt = AttemptOn({"cuda:0"}, 0);
  EXPECT_EQ(ImpossiblePeak(attempt, devices, 70LL << 30), "");
  const std::string why = ImpossiblePeak(attempt, devices, 100LL << 30);
  EXPECT_TRUE(absl::StrContains(why, "more than its device has (80.00 GiB)")) << why;
  // Another device's memory does not count for this attempt.
  EXPECT_NE(ImpossiblePeak(attempt, devices, 120LL << 30), "");
}

TEST(ImpossiblePeakTest, OnCpuDevicesTheCgroupsPeakBoundsTheRanksWord) {
  const std::vector<fitrun::v1::Device> devices = {Device("cpu:0", fitrun::v1::DEVICE_KIND_CPU, 4LL << 30)};
  EXPECT_EQ(ImpossiblePeak(AttemptOn({"cpu:0"}, 1LL << 30), devices, 512LL << 20), "");
  const std::string why = ImpossiblePeak(AttemptOn({"cpu:0"}, 1LL << 30), devices, 2LL << 30);
  EXPECT_TRUE(absl::StrContains(why, "by its cgroup")) << why;
  // No cgroup figure (fitrund without job cgroups): only the device bounds it.
  EXPECT_EQ(ImpossiblePeak(AttemptOn({"cpu:0"}, 0), devices, 2LL << 30), "");
}

}  // namespace
}  // namespace fitrun::server
