#include "server/core/jobs/device_holders.h"

#include <algorithm>

namespace fitrun::server {

void DeviceHolders::Hold(const std::string& job_id, const std::vector<std::string>& device_ids) {
  for (size_t rank = 0; rank < device_ids.size(); ++rank) holder_[device_ids[rank]] = {job_id, static_cast<int>(rank)};
}

void DeviceHolders::Release(const std::vector<std::string>& device_ids) {
  for (const std::string& device : device_ids) holder_.erase(device);
}

std::set<std::string> DeviceHolders::HoldingJobs() const {
  std::set<std::string> jobs;
  for (const auto& [device, holder] : holder_) jobs.insert(holder.first);
  return jobs;
}

std::vector<fitrun::v1::Device> DeviceHolders::Devices(const JobTable& table) const {
  std::vector<fitrun::v1::Device> devices = inventory_->Snapshot();
  for (fitrun::v1::Device& device : devices) {
    auto holder = holder_.find(device.id());
    if (holder == holder_.end()) continue;
    const auto& [job_id, rank] = holder->second;
    device.set_job_id(job_id);
    device.set_rank(rank);
    const JobEntry* entry = table.Find(job_id);
    if (entry == nullptr || !entry->active || rank >= static_cast<int>(entry->active->ranks.size())) continue;
    if (!entry->record.job.attempt_history().empty()) {
      device.set_planned_bytes(entry->record.job.attempt_history().rbegin()->predicted_peak_bytes());
    }
    device.set_peak_bytes(entry->active->ranks[rank].peak_bytes);
    // A virtual device's inventory does not see its rank's allocations (a GPU's NVML does): what is
    // free is what the rank has not reached.
    if (device.kind() == fitrun::v1::DEVICE_KIND_CPU) {
      device.set_free_bytes(std::max<int64_t>(0, device.total_bytes() - device.peak_bytes()));
    }
  }
  return devices;
}

}  // namespace fitrun::server
