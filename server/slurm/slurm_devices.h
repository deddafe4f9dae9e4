// The devices of a Slurm cluster, for fitrund --cluster=slurm: every usable node's GPUs (from its
// Gres, with the memory size an operator gives per GPU type, since slurmctld does not know it) or,
// on clusters without GPUs, a fixed number of virtual CPU devices per node. Read from `scontrol show
// node --oneliner` at start and then every `refresh_interval`, so drained or failed nodes drop out
// and resumed ones come back without a restart.
//
// Thread-safe. The object owns one refresh thread, which alone runs scontrol; Snapshot and
// NodeAddress only copy the latest good listing under a mutex, so they never wait for a command.
#ifndef FITRUN_SERVER_SLURM_SLURM_DEVICES_H_
#define FITRUN_SERVER_SLURM_SLURM_DEVICES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/device_inventory.h"
#include "server/slurm/slurm_command.h"
#include "server/slurm/slurm_text.h"

namespace fitrun::server::slurm {

class SlurmDevices : public DeviceInventory {
 public:
  struct Options {
    // Only nodes whose Partitions= lists it; empty: every node.
    std::string partition;
    // GPU type (the Gres type, "gpu" for untyped GPUs) -> memory of one GPU in bytes
    // (--slurm_gpu_memory, ParseGpuMemoryFlag).
    std::map<std::string, int64_t> gpu_memory;
    // Per node: this many virtual CPU devices of this many bytes each, in place of its GPUs
    // (--slurm_virtual_devices, ParseVirtualDevicesFlag).
    std::optional<std::pair<int, int64_t>> virtual_devices;
    absl::Duration refresh_interval = absl::Seconds(5);
    // Runs scontrol; empty: RealSlurmRunner().
    SlurmRunner runner;
  };

  // Lists the nodes once before returning, so a cluster fitrund cannot use stops it at start:
  // UNAVAILABLE when scontrol fails (slurmctld unreachable, with the fix), NOT_FOUND when scontrol is
  // not installed, INVALID_ARGUMENT naming --slurm_gpu_memory when a usable node has GPUs of a type
  // the table lacks (and there are no virtual devices), FAILED_PRECONDITION naming every node seen
  // and why none gives a device.
  static absl::StatusOr<std::unique_ptr<SlurmDevices>> Create(Options options);

  // Stops the refresh thread: at once when it is waiting, after the command in flight otherwise
  // (bounded by the runner's timeout).
  ~SlurmDevices() override;
  SlurmDevices(const SlurmDevices&) = delete;
  SlurmDevices& operator=(const SlurmDevices&) = delete;

  // The devices of the latest good listing: per usable node in scontrol's order, "<node>/cuda:<i>"
  // (total = free = the table's size for its type, cpu_threads = the node's CPUs shared among its
  // GPUs) or "<node>/cpu:<i>" with virtual devices. A refresh that fails keeps the previous list; on
  // a later refresh, a node with GPUs of a type the table lacks is left out (logged once) rather
  // than failing the whole listing.
  std::vector<fitrun::v1::Device> Snapshot() override;

  // NodeAddr of `node` in the latest good listing (any node scontrol lists, usable or not, in the
  // partition or not); nullopt for a node it does not list.
  std::optional<std::string> NodeAddress(const std::string& node);

 private:
  struct Listing {
    std::vector<SlurmNode> nodes;
    std::vector<fitrun::v1::Device> devices;
  };

  explicit SlurmDevices(Options options, Listing first);
  void RefreshLoop();
  // One refresh: list, and on success replace listing_; on failure log one line and keep it.
  void Refresh();

  const Options options_;

  absl::Mutex mu_;
  Listing listing_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // The refresh thread's own: what it has already logged, so a lasting problem is one line, not one
  // per refresh.
  std::string last_failure_;
  std::set<std::string> warned_missing_types_;

  std::thread refresher_;
};

}  // namespace fitrun::server::slurm

#endif  // FITRUN_SERVER_SLURM_SLURM_DEVICES_H_
