// The devices a node offers. Virtual CPU devices and (later) NVML-backed GPUs implement it; the
// planner only ever sees the numbers.
#ifndef FITRUN_SERVER_CORE_DEVICE_INVENTORY_H_
#define FITRUN_SERVER_CORE_DEVICE_INVENTORY_H_

#include <vector>

#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

// Implementations are thread-safe.
class DeviceInventory {
 public:
  virtual ~DeviceInventory() = default;
  // Every device with its current memory figures. Occupancy (job_id, rank) is the job manager's
  // to fill in; inventories leave it empty.
  virtual std::vector<fitrun::v1::Device> Snapshot() = 0;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_DEVICE_INVENTORY_H_
