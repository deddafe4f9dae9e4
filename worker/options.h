#ifndef FITRUN_WORKER_OPTIONS_H_
#define FITRUN_WORKER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/worker.pb.h"

namespace fitrun::worker {

// Everything a worker process is told by whoever launched it (fitrund, or a person by hand):
// the torchrun variables and the FITRUN_* ones.
struct WorkerOptions {
  int rank = 0;              // RANK
  int local_rank = 0;        // LOCAL_RANK (default RANK)
  int world_size = 1;        // WORLD_SIZE
  int local_world_size = 1;  // LOCAL_WORLD_SIZE (default WORLD_SIZE)
  std::string master_addr;   // MASTER_ADDR
  int master_port = 0;       // MASTER_PORT
  // TORCHELASTIC_USE_AGENT_STORE=True: the launcher holds the store (fitrund, for a local attempt)
  // and rank 0 is its client like every rank, rather than its host.
  bool agent_store = false;
  std::string assignment_path;  // FITRUN_ASSIGNMENT
  // FITRUN_COORDINATOR (host:port); empty means standalone: reports only go to the log.
  std::string coordinator;
  // The CA file to verify a TLS coordinator with (FITRUN_TLS_CA); empty: plain text.
  std::string tls_ca;
  std::string job_id;     // FITRUN_JOB_ID
  int attempt = 0;        // FITRUN_ATTEMPT
  // The job's secret the rank presents to fitrund: read from descriptor job_token_fd
  // (FITRUN_JOB_TOKEN_FD) by TakeJobToken, or FITRUN_JOB_TOKEN where a launcher could only set that.
  std::string job_token;
  int job_token_fd = -1;
  // FITRUN_DUMP_INITIAL_STATE: a directory where rank 0 writes the parameters it trains from (after
  // the broadcast) and the sample order, so that another implementation (PyTorch's DDP in the parity
  // test and the benchmark) can start from exactly the same point. Empty: nothing is written.
  std::string initial_state_dump_dir;
  // FITRUN_ALL_REDUCE=gloo turns this off: sums over Gloo's sockets even on one machine.
  bool shared_memory_all_reduce = true;
};

// A rank's device as the plan names it (plan.device_ids[rank]). Plain C++ so that this library needs
// no LibTorch; fitrun-worker turns it into a torch::Device. A "cpu:N" device is a virtual CPU device
// (a memory budget on the host), so every CPU index is LibTorch's one CPU device.
struct PlanDevice {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;
};

// Parses "cpu:N" or "cuda:N" ("gpu:N" is accepted as cuda, as the collective backend does); errors
// name `field`.
absl::StatusOr<PlanDevice> ParsePlanDevice(const std::string& device_id, const std::string& field);

// Looks a variable up; nullopt when unset. main passes the process environment, tests a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads and checks the variables. Errors name the variable and what was wrong with it.
absl::StatusOr<WorkerOptions> WorkerOptionsFromEnvironment(const EnvLookup& lookup);

// When the job token comes by descriptor (options.job_token_fd; the rank runs as its owner's
// account): makes this process unreadable to the job's other processes, which run as the same
// account (not dumpable: none may ptrace it or read its /proc/<pid>/environ or memory), then reads
// the token and closes the descriptor. A rank calls it first thing; INVALID_ARGUMENT naming the
// variable when the descriptor holds no token.
absl::Status TakeJobToken(WorkerOptions& options);

// For a rank started warm (FITRUN_WARM_FD set, fitrund --warm_ranks): blocks until fitrund hands it
// its job on that descriptor as launch_contract.h says, then takes it: its log file as stdout and
// stderr (opened as this process, which already runs as the job's owner), its working directory,
// its variables set in the environment and FITRUN_JOB_TOKEN_FD naming the same descriptor, whose
// rest is the token. OK at once for a rank started for its job; CANCELLED when the descriptor ends
// before a job came (fitrund stopped or let this rank go); any other error names what was wrong.
absl::Status AwaitWarmIdentity();
// When AwaitWarmIdentity took this process's job; unset for a rank started for its job.
std::optional<absl::Time> WarmIdentityTakenAt();

// Parses a text-format fitrun.v1.WorkerAssignment; errors carry the file, line and column.
absl::StatusOr<fitrun::v1::WorkerAssignment> LoadAssignment(const std::string& path);

// What a rank is told to use, read from the assignment in one place: its device, the cap on its
// device's memory (a virtual CPU device's, or a GPU slice's allocator cap; 0: none) and its threads.
struct RankResources {
  std::string device_id;     // plan.device_ids[rank]
  std::string device_field;  // "plan.device_ids[rank]", for errors
  PlanDevice device;
  int64_t memory_cap_bytes = 0;
  int cpu_threads = 1;
};
// Errors name the field; `rank` must be one of the assignment's.
absl::StatusOr<RankResources> ResourcesOf(const fitrun::v1::WorkerAssignment& assignment, int rank);
// What a memory probe runs with: rank 0's cap and threads, on the host whatever the plan's device.
RankResources ProbeResourcesOf(const fitrun::v1::WorkerAssignment& assignment);

// Checks what this rank needs from the assignment before it does anything expensive: that it agrees
// with the environment (world size, job) and that the fields the worker reads (this rank's device
// among them) are usable. Errors name
// the field. (Plan numbers that depend on the dataset are checked by the trainer.)
absl::Status ValidateAssignment(const fitrun::v1::WorkerAssignment& assignment,
                                const WorkerOptions& options);

// What the command line may say (fitrun-worker's and fitrun-supervisor's alike); without --probe the
// program runs one rank as its environment describes.
struct CommandLine {
  bool probe = false;
  // --probe_batches=B1,B2,...: measure these and exit; empty: read batch sizes from stdin.
  std::vector<int64_t> probe_batches;
};
absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_OPTIONS_H_
