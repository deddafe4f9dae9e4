#include "server/slurm/slurm_devices.h"

#include <algorithm>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "proto/contract/log.h"

namespace fitrun::server::slurm {
namespace {

const std::vector<std::string>& ShowNodesCommand() {
  static const auto* command = new std::vector<std::string>{"scontrol", "show", "node", "--oneliner"};
  return *command;
}

// How many nodes a start-up error names before "and N more".
constexpr size_t kNodesNamed = 12;

// A GPU type of a usable node that --slurm_gpu_memory has no size for.
struct MissingGpuMemory {
  std::string node;
  std::string key;
};

// What a listing's nodes give.
struct NodeDevices {
  std::vector<fitrun::v1::Device> devices;
  // Per node that gives none: "n2 (State=DOWN+DRAIN)".
  std::vector<std::string> why_none;
  bool any_without_gpus = false;
  bool any_unusable = false;
  bool any_outside_partition = false;
  std::vector<MissingGpuMemory> missing;
};

NodeDevices DevicesOf(const std::vector<SlurmNode>& nodes, const SlurmDevices::Options& options) {
  NodeDevices out;
  for (const SlurmNode& node : nodes) {
    if (!options.partition.empty() &&
        std::find(node.partitions.begin(), node.partitions.end(), options.partition) == node.partitions.end()) {
      out.why_none.push_back(absl::StrCat(node.name, " (not in partition '", options.partition, "')"));
      out.any_outside_partition = true;
      continue;
    }
    if (!node.Usable()) {
      out.why_none.push_back(absl::StrCat(node.name, " (State=", node.state, ")"));
      out.any_unusable = true;
      continue;
    }
    if (options.virtual_devices.has_value()) {
      const auto [count, bytes] = *options.virtual_devices;
      for (int i = 0; i < count; ++i) {
        fitrun::v1::Device& device = out.devices.emplace_back();
        device.set_id(absl::StrCat(node.name, "/cpu:", i));
        device.set_kind(fitrun::v1::DEVICE_KIND_CPU);
        device.set_name("virtual CPU device");
        device.set_total_bytes(bytes);
        device.set_free_bytes(bytes);
        device.set_cpu_threads(std::max(1, node.cpus / count));
        device.set_node(node.name);
      }
      continue;
    }
    int gpu_count = 0;
    std::vector<std::string> missing_keys;
    for (const SlurmGpus& gpus : node.gpus) {
      gpu_count += gpus.count;
      if (!options.gpu_memory.count(GpuMemoryKey(gpus))) missing_keys.push_back(GpuMemoryKey(gpus));
    }
    if (gpu_count == 0) {
      out.why_none.push_back(absl::StrCat(node.name, " (no GPUs in Gres)"));
      out.any_without_gpus = true;
      continue;
    }
    if (!missing_keys.empty()) {
      for (const std::string& key : missing_keys) out.missing.push_back({node.name, key});
      out.why_none.push_back(
          absl::StrCat(node.name, " (no --slurm_gpu_memory size for GPU type '", missing_keys.front(), "')"));
      continue;
    }
    int index = 0;
    for (const SlurmGpus& gpus : node.gpus) {
      const std::string key = GpuMemoryKey(gpus);
      const int64_t bytes = options.gpu_memory.at(key);
      for (int i = 0; i < gpus.count; ++i) {
        fitrun::v1::Device& device = out.devices.emplace_back();
        device.set_id(absl::StrCat(node.name, "/cuda:", index++));
        device.set_kind(fitrun::v1::DEVICE_KIND_CUDA);
        device.set_name(key);
        device.set_total_bytes(bytes);
        device.set_free_bytes(bytes);
        device.set_cpu_threads(std::max(1, node.cpus / gpu_count));
        device.set_node(node.name);
      }
    }
  }
  return out;
}

std::string MissingGpuMemoryError(const std::vector<MissingGpuMemory>& missing) {
  std::vector<std::string> seen_keys;
  std::vector<std::string> parts;
  for (const MissingGpuMemory& m : missing) {
    if (std::find(seen_keys.begin(), seen_keys.end(), m.key) != seen_keys.end()) continue;
    seen_keys.push_back(m.key);
    parts.push_back(absl::StrCat("'", m.key, "'", m.key == "gpu" ? " (untyped, Gres=gpu:N)" : "", " on node ", m.node));
  }
  return absl::StrCat("--slurm_gpu_memory: no memory size for GPU type ", absl::StrJoin(parts, ", nor "), "; add ",
                      absl::StrJoin(seen_keys, ",", [](std::string* out, const std::string& key) {
                        absl::StrAppend(out, key, "=<size>");
                      }),
                      ", e.g. --slurm_gpu_memory=", seen_keys.front(), "=80GiB");
}

std::string NoDeviceError(size_t node_count, const NodeDevices& seen) {
  if (node_count == 0) {
    return "slurm inventory: `scontrol show node --oneliner` lists no nodes; check that SLURM_CONF names the "
           "cluster's slurm.conf";
  }
  std::vector<std::string> named = seen.why_none;
  if (named.size() > kNodesNamed) {
    named.resize(kNodesNamed);
    named.push_back(absl::StrCat("and ", seen.why_none.size() - kNodesNamed, " more"));
  }
  std::vector<std::string> fixes;
  if (seen.any_without_gpus) fixes.push_back("pass --slurm_virtual_devices=2x4GiB for CPU devices");
  if (seen.any_unusable) {
    fixes.push_back("resume drained or down nodes (scontrol update nodename=NODE state=resume)");
  }
  if (seen.any_outside_partition) fixes.push_back("check the partition's name (scontrol show partition)");
  return absl::StrCat("slurm inventory: none of the ", node_count, " nodes gives a device: ",
                      absl::StrJoin(named, ", "), fixes.empty() ? "" : "; ", absl::StrJoin(fixes, "; or "));
}

// Error text on one log line.
std::string OneLine(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"\r", ""}, {"\n", " | "}});
}

}  // namespace

absl::StatusOr<std::unique_ptr<SlurmDevices>> SlurmDevices::Create(Options options) {
  if (options.refresh_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("slurm inventory: refresh_interval must be positive");
  }
  if (options.virtual_devices.has_value() &&
      (options.virtual_devices->first < 1 || options.virtual_devices->second < 1)) {
    return absl::InvalidArgumentError("--slurm_virtual_devices: needs at least one device of at least one byte");
  }
  if (!options.runner) options.runner = RealSlurmRunner();

  absl::StatusOr<std::string> output = options.runner(ShowNodesCommand());
  if (!output.ok()) {
    if (absl::IsNotFound(output.status())) {
      return absl::NotFoundError(absl::StrCat("slurm inventory: ", output.status().message()));
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot reach slurmctld: ", output.status().message(),
        "; check that slurmctld runs and that SLURM_CONF (default /etc/slurm/slurm.conf) names its slurm.conf "
        "(`scontrol ping` should say it is UP)"));
  }
  absl::StatusOr<std::vector<SlurmNode>> nodes = ParseNodes(*output);
  if (!nodes.ok()) {
    return absl::InternalError(
        absl::StrCat("slurm inventory: cannot read Slurm's node list: ", nodes.status().message()));
  }
  NodeDevices seen = DevicesOf(*nodes, options);
  if (!seen.missing.empty()) return absl::InvalidArgumentError(MissingGpuMemoryError(seen.missing));
  if (seen.devices.empty()) return absl::FailedPreconditionError(NoDeviceError(nodes->size(), seen));

  Listing first{*std::move(nodes), std::move(seen.devices)};
  return std::unique_ptr<SlurmDevices>(new SlurmDevices(std::move(options), std::move(first)));
}

SlurmDevices::SlurmDevices(Options options, Listing first) : options_(std::move(options)), listing_(std::move(first)) {
  refresher_ = std::thread([this] { RefreshLoop(); });
}

SlurmDevices::~SlurmDevices() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  refresher_.join();
}

std::vector<fitrun::v1::Device> SlurmDevices::Snapshot() {
  absl::MutexLock lock(&mu_);
  return listing_.devices;
}

std::optional<std::string> SlurmDevices::NodeAddress(const std::string& node) {
  absl::MutexLock lock(&mu_);
  for (const SlurmNode& n : listing_.nodes) {
    if (n.name == node) return n.addr;
  }
  return std::nullopt;
}

void SlurmDevices::RefreshLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.refresh_interval)) return;
    }
    Refresh();
  }
}

void SlurmDevices::Refresh() {
  std::string failure;
  absl::StatusOr<std::string> output = options_.runner(ShowNodesCommand());
  absl::StatusOr<std::vector<SlurmNode>> nodes = absl::InternalError("not listed");
  if (!output.ok()) {
    failure = std::string(output.status().message());
  } else if (nodes = ParseNodes(*output); !nodes.ok()) {
    failure = absl::StrCat("cannot read Slurm's node list: ", nodes.status().message());
  }
  if (!failure.empty()) {
    // A lasting failure (slurmctld down for an hour) is one line, not one per refresh.
    if (failure != last_failure_) {
      contract::LogWarning("slurm inventory: %s; keeping the last list", OneLine(failure));
    }
    last_failure_ = failure;
    return;
  }
  if (!last_failure_.empty()) {
    contract::LogInfo("slurm inventory: scontrol answers again");
    last_failure_.clear();
  }
  NodeDevices seen = DevicesOf(*nodes, options_);
  for (const MissingGpuMemory& m : seen.missing) {
    if (warned_missing_types_.insert(absl::StrCat(m.node, "\n", m.key)).second) {
      contract::LogWarning(
          "slurm inventory: node %s left out: no memory size for its GPU type '%s' "
          "(add %s=<size> to --slurm_gpu_memory)",
          m.node, m.key, m.key);
    }
  }
  absl::MutexLock lock(&mu_);
  listing_ = Listing{*std::move(nodes), std::move(seen.devices)};
}

}  // namespace fitrun::server::slurm
