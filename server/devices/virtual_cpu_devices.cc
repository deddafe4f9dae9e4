#include "server/devices/virtual_cpu_devices.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace fitrun::server {

absl::StatusOr<std::unique_ptr<VirtualCpuDevices>> VirtualCpuDevices::Create(absl::string_view flag, int cores,
                                                                             int64_t memory_bytes) {
  cores = std::max(1, cores);
  int count = 0;
  int64_t bytes_each = 0;
  if (flag == "auto") {
    count = std::min(cores, 8);
    bytes_each = std::max<int64_t>(256LL << 20, memory_bytes / 2 / count);
  } else {
    absl::string_view spec = flag;
    if (!absl::ConsumePrefix(&spec, "cpu:")) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: '", flag, "' is not 'auto' or 'cpu:NxSIZE' (e.g. cpu:2x4GiB)"));
    }
    const size_t x = spec.find('x');
    if (x == absl::string_view::npos || !absl::SimpleAtoi(spec.substr(0, x), &count) || count < 1 || count > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: '", flag, "' needs a device count from 1 to 1024 before 'x' (e.g. cpu:2x4GiB)"));
    }
    absl::StatusOr<int64_t> size = ParseByteSize(spec.substr(x + 1));
    if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat("--devices: ", size.status().message()));
    bytes_each = *size;
  }
  std::vector<fitrun::v1::Device> devices;
  for (int i = 0; i < count; ++i) {
    fitrun::v1::Device device;
    device.set_id(absl::StrCat("cpu:", i));
    device.set_kind(fitrun::v1::DEVICE_KIND_CPU);
    device.set_name("virtual CPU device");
    device.set_total_bytes(bytes_each);
    device.set_free_bytes(bytes_each);
    // Cores are shared out; with more devices than cores each still gets one thread.
    device.set_cpu_threads(std::max(1, cores / count));
    devices.push_back(std::move(device));
  }
  return std::unique_ptr<VirtualCpuDevices>(new VirtualCpuDevices(std::move(devices)));
}

}  // namespace fitrun::server
