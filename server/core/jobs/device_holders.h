// Which rank of which job holds each device, and the devices as the coordinator shows and plans
// them: the inventory's snapshot with each held device's job and rank, the plan's and the rank's
// peak bytes.
//
// Thread-safety: none of its own; the job manager holds it under its lock, with the job table.
#ifndef FITRUN_SERVER_CORE_JOBS_DEVICE_HOLDERS_H_
#define FITRUN_SERVER_CORE_JOBS_DEVICE_HOLDERS_H_

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fitrun/v1/job.pb.h"
#include "server/core/device_inventory.h"
#include "server/core/jobs/job_table.h"

namespace fitrun::server {

class DeviceHolders {
 public:
  // `inventory` must outlive the holders.
  explicit DeviceHolders(DeviceInventory* inventory) : inventory_(inventory) {}

  // Rank r of the job holds device_ids[r] from now on.
  void Hold(const std::string& job_id, const std::vector<std::string>& device_ids);
  void Release(const std::vector<std::string>& device_ids);
  // The jobs holding a device, each once: every job with an attempt whose ranks may be alive.
  std::set<std::string> HoldingJobs() const;

  // Every device, with the memory a plan may use and, while a rank holds it, its job, rank, planned
  // and peak bytes (from the holding job's entry in `table`).
  std::vector<fitrun::v1::Device> Devices(const JobTable& table) const;
  // The inventory's own view (no holders): what each device is and has in all.
  std::vector<fitrun::v1::Device> Inventory() const { return inventory_->Snapshot(); }

 private:
  DeviceInventory* const inventory_;
  // device id -> (job id, rank) of the rank holding it.
  std::map<std::string, std::pair<std::string, int>> holder_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_DEVICE_HOLDERS_H_
