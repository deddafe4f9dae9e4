// Virtual CPU devices: the inventory on a machine without GPUs. Each device is a memory budget that
// the worker enforces with a capped allocator, plus a share of the cores for its threads, so
// planning, OOMs and multi-rank training behave as on GPUs, only slower.
#ifndef FITRUN_SERVER_DEVICES_VIRTUAL_CPU_DEVICES_H_
#define FITRUN_SERVER_DEVICES_VIRTUAL_CPU_DEVICES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/device_inventory.h"
#include "server/core/units.h"  // ParseByteSize, which reads the flag's sizes

namespace fitrun::server {

class VirtualCpuDevices : public DeviceInventory {
 public:
  // From a --devices value: "cpu:NxSIZE" (e.g. "cpu:2x4GiB"; SIZE in B, KiB, MiB, GiB, TiB) or
  // "auto" (up to 8 devices, one per core, sharing half the machine's memory). `cores` and
  // `memory_bytes` describe the machine.
  static absl::StatusOr<std::unique_ptr<VirtualCpuDevices>> Create(absl::string_view flag, int cores,
                                                                   int64_t memory_bytes);

  std::vector<fitrun::v1::Device> Snapshot() override { return devices_; }

 private:
  explicit VirtualCpuDevices(std::vector<fitrun::v1::Device> devices) : devices_(std::move(devices)) {}
  const std::vector<fitrun::v1::Device> devices_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_DEVICES_VIRTUAL_CPU_DEVICES_H_
