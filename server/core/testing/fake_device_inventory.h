// A DeviceInventory of fixed devices, CPUs or GPUs, all free. Not changed after construction: any thread.
#ifndef FITRUN_SERVER_CORE_TESTING_FAKE_DEVICE_INVENTORY_H_
#define FITRUN_SERVER_CORE_TESTING_FAKE_DEVICE_INVENTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/device_inventory.h"

namespace fitrun::server {

class FakeDeviceInventory : public DeviceInventory {
 public:
  // `count` CPU devices of `bytes` each.
  FakeDeviceInventory(int count, int64_t bytes) {
    for (int i = 0; i < count; ++i) {
      fitrun::v1::Device device;
      device.set_id("cpu:" + std::to_string(i));
      device.set_kind(fitrun::v1::DEVICE_KIND_CPU);
      device.set_total_bytes(bytes);
      device.set_free_bytes(bytes);
      device.set_cpu_threads(1);
      devices_.push_back(device);
    }
  }
  // GPUs instead: `count` CUDA devices of `bytes` each named `name`, slices of `slice_bytes` when
  // it is set (ids "cuda:0#k" as the GPU offer names several slices of one GPU).
  static FakeDeviceInventory Gpus(int count, int64_t bytes, const std::string& name, int64_t slice_bytes = 0) {
    FakeDeviceInventory gpus(0, 0);
    for (int i = 0; i < count; ++i) {
      fitrun::v1::Device device;
      device.set_id(slice_bytes > 0 ? "cuda:0#" + std::to_string(i) : "cuda:" + std::to_string(i));
      device.set_kind(fitrun::v1::DEVICE_KIND_CUDA);
      device.set_name(name);
      device.set_total_bytes(slice_bytes > 0 ? slice_bytes : bytes);
      device.set_free_bytes(slice_bytes > 0 ? slice_bytes : bytes);
      device.set_slice_bytes(slice_bytes);
      device.set_cpu_threads(1);
      gpus.devices_.push_back(device);
    }
    return gpus;
  }
  std::vector<fitrun::v1::Device> Snapshot() override { return devices_; }

 private:
  std::vector<fitrun::v1::Device> devices_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_TESTING_FAKE_DEVICE_INVENTORY_H_
