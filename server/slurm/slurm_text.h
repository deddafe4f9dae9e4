// What Slurm's client commands print, read into plain structs. Pure text parsing: no process is
// run here (slurm_command.h runs them), so every function is tested on real Slurm 22.05 output.
//
// Slurm's output varies between versions, so the readers are forgiving where that is safe and strict
// where guessing would mislead: unknown keys are ignored, missing optional keys take Slurm's own
// defaults, and a required key that is missing or malformed is an error naming the key, the line and
// its value. Stateless; every function is thread-safe.
#ifndef FITRUN_SERVER_SLURM_SLURM_TEXT_H_
#define FITRUN_SERVER_SLURM_SLURM_TEXT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fitrun::server::slurm {

// One `scontrol show <entity> --oneliner` line as Key -> Value. A key is a letter followed by
// letters, digits, '_', ':' or '/' ("AllocNode:Sid", "CPUs/Task") and starts the line or follows
// whitespace; its value runs to the whitespace before the next key, so values may hold spaces
// ("OS=Linux 6.1.0 #1 SMP") and '=' ("CfgTRES=cpu=2,mem=4G"). Trailing whitespace is dropped. A
// repeated key keeps its last value. Text before the first key is ignored.
std::map<std::string, std::string> ParseOneliner(absl::string_view line);

// GPUs of one type on a node. `type` is empty for untyped GPUs ("gpu:2").
struct SlurmGpus {
  std::string type;
  int count = 0;

  bool operator==(const SlurmGpus& other) const { return type == other.type && count == other.count; }
};

// A node's Gres= field: "(null)" or "" -> none; "gpu:a100:2(S:0-1)", "gpu:2", "gpu:tesla:4,shard:8" ->
// the gpu entries in order (other gres such as shard or mps are ignored). INVALID_ARGUMENT for a gpu
// entry whose count is not a number.
absl::StatusOr<std::vector<SlurmGpus>> ParseGpuGres(absl::string_view gres);

// One node of `scontrol show node --oneliner`.
struct SlurmNode {
  std::string name;   // NodeName
  std::string addr;   // NodeAddr (Slurm's default, the name, when absent)
  std::string state;  // State, as printed: "IDLE", "MIXED", "IDLE+DRAIN", "DOWN*", ...
  int cpus = 0;       // CPUEfctv (the CPUs jobs may use), else CPUTot
  int64_t real_memory_bytes = 0;  // RealMemory, which Slurm gives in MiB
  std::vector<SlurmGpus> gpus;
  std::vector<std::string> partitions;

  // Whether Slurm would start a job on it now: false when a state flag says it is down, drained or
  // draining, failing, not responding ('*'), powered or powering down ('~', '%'), in maintenance
  // ('$'), FUTURE, or not yet registered (UNKNOWN, INVAL).
  bool Usable() const;
};

// Every node of `scontrol show node --oneliner`, in its order. Blank lines are skipped and "No nodes
// in the system" is an empty list. Required per node: NodeName, State and CPUEfctv or CPUTot; a line
// without them, or with a malformed RealMemory or Gres, is an error naming the line, node and key.
absl::StatusOr<std::vector<SlurmNode>> ParseNodes(absl::string_view scontrol_show_node_oneliner_output);

// A batch job's state as scontrol or squeue report it.
struct SlurmJobStatus {
  std::string id;
  // The base state or the flag squeue shows instead ("PENDING", "RUNNING", "COMPLETING", "FAILED", ...);
  // only its first word is kept (sacct's "CANCELLED by 0" -> "CANCELLED").
  std::string state;
  std::string reason;  // Why it waits or ended ("Resources", "NonZeroExitCode"); "" for Slurm's "None"
  std::string nodes;   // Its node list in Slurm's compressed form ("n[1-2]"); "" before it has nodes
  int exit_code = 0;   // ExitCode=A:B's A (the batch script's exit status); squeue does not report it
  int exit_signal = 0;  // and B, the signal that ended it (0 when none)
  // Whose job it is and what it was submitted as (scontrol show job only; squeue leaves them
  // unset): UserId=name(uid)'s uid (-1 when not shown), JobName, and Comment ("" when none).
  int64_t user_id = -1;
  std::string name;
  std::string comment;

  // A final state: COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY,
  // BOOT_FAIL, DEADLINE, REVOKED. A job in one never runs again.
  bool Ended() const;
  // Not running yet, its allocation still to come or its nodes still booting: PENDING, CONFIGURING,
  // REQUEUED, REQUEUE_HOLD, REQUEUE_FED, SPECIAL_EXIT, RESV_DEL_HOLD, POWER_UP_NODE.
  bool Pending() const;
};

// The first non-blank line of `scontrol show job --oneliner <id>`. JobId and JobState are required;
// Reason, NodeList, ExitCode (A:B), UserId, JobName and Comment are optional, but a malformed ExitCode
// is an error.
absl::StatusOr<SlurmJobStatus> ParseShowJob(absl::string_view line);

// The format ParseSqueue reads: pass it to `squeue --noheader --format=` as is.
inline constexpr absl::string_view kSqueueFormat = "%i|%T|%r|%N";

// Every line of `squeue --noheader --format=<kSqueueFormat>` (blank lines skipped): id, state,
// reason and nodes. Exit codes are not in squeue's output and stay 0.
absl::StatusOr<std::vector<SlurmJobStatus>> ParseSqueue(absl::string_view output);

// The job id `sbatch --parsable` prints: "<jobid>" or "<jobid>;<cluster>". An error unless the id is
// all digits.
absl::StatusOr<std::string> ParseSbatchParsable(absl::string_view out);

// --slurm_gpu_memory=TYPE=SIZE,... ("a100=80GiB,t4=16GiB"): GPU type -> bytes each. Untyped GPUs
// ("Gres=gpu:2") are looked up under "gpu". An empty flag is an empty map. Errors start with
// "--slurm_gpu_memory: " and show the expected form.
absl::StatusOr<std::map<std::string, int64_t>> ParseGpuMemoryFlag(absl::string_view flag);

// The GPU memory table's key for a node's GPUs: their type, or "gpu" when untyped.
std::string GpuMemoryKey(const SlurmGpus& gpus);

// --slurm_virtual_devices=COUNTxSIZE ("2x4GiB"): the count (1 to 1024) and bytes of each node's
// virtual CPU devices. Errors start with "--slurm_virtual_devices: ".
absl::StatusOr<std::pair<int, int64_t>> ParseVirtualDevicesFlag(absl::string_view flag);

}  // namespace fitrun::server::slurm

#endif  // FITRUN_SERVER_SLURM_SLURM_TEXT_H_
