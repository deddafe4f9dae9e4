#include "worker/options.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/contract/launch_contract.h"

namespace fitrun::worker {
namespace {

namespace launch = fitrun::contract::launch;

absl::StatusOr<std::string> Required(const EnvLookup& lookup, const std::string& name) {
  std::optional<std::string> value = lookup(name);
  if (!value.has_value() || value->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not set"));
  }
  return *value;
}

absl::StatusOr<int> ParseInt(const std::string& name, const std::string& text, int min, int max) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be an integer in [", min, ", ", max, "] (got \"", text, "\")"));
  }
  return value;
}

absl::StatusOr<int> RequiredInt(const EnvLookup& lookup, const std::string& name, int min, int max) {
  absl::StatusOr<std::string> text = Required(lookup, name);
  if (!text.ok()) return text.status();
  return ParseInt(name, *text, min, max);
}

std::string Optional(const EnvLookup& lookup, const std::string& name) {
  return lookup(name).value_or("");
}

class CollectFirstError final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

absl::StatusOr<WorkerOptions> WorkerOptionsFromEnvironment(const EnvLookup& lookup) {
  WorkerOptions options;
  constexpr int kMaxWorld = 1 << 16;

  absl::StatusOr<int> world_size = RequiredInt(lookup, launch::kWorldSize, 1, kMaxWorld);
  if (!world_size.ok()) return world_size.status();
  options.world_size = *world_size;
  absl::StatusOr<int> rank = RequiredInt(lookup, launch::kRank, 0, options.world_size - 1);
  if (!rank.ok()) return rank.status();
  options.rank = *rank;

  const std::string local_world = Optional(lookup, launch::kLocalWorldSize);
  options.local_world_size = options.world_size;
  if (!local_world.empty()) {
    absl::StatusOr<int> v = ParseInt(launch::kLocalWorldSize, local_world, 1, kMaxWorld);
    if (!v.ok()) return v.status();
    options.local_world_size = *v;
  }
  const std::string local_rank = Optional(lookup, launch::kLocalRank);
  options.local_rank = options.rank;
  if (!local_rank.empty()) {
    absl::StatusOr<int> v = ParseInt(launch::kLocalRank, local_rank, 0, options.local_world_size - 1);
    if (!v.ok()) return v.status();
    options.local_rank = *v;
  }

  absl::StatusOr<std::string> master_addr = Required(lookup, launch::kMasterAddr);
  if (!master_addr.ok()) return master_addr.status();
  options.master_addr = *master_addr;
  absl::StatusOr<int> master_port = RequiredInt(lookup, launch::kMasterPort, 1, 65535);
  if (!master_port.ok()) return master_port.status();
  options.master_port = *master_port;
  options.agent_store = Optional(lookup, launch::kUseAgentStore) == "True";

  absl::StatusOr<std::string> assignment = Required(lookup, launch::kAssignment);
  if (!assignment.ok()) return assignment.status();
  options.assignment_path = *assignment;

  options.coordinator = Optional(lookup, launch::kCoordinator);
  options.tls_ca = Optional(lookup, launch::kTlsCa);
  options.job_id = Optional(lookup, launch::kJobId);
  options.job_token = Optional(lookup, launch::kJobToken);
  if (const std::string fd = Optional(lookup, launch::kJobTokenFd); !fd.empty()) {
    absl::StatusOr<int> v = ParseInt(launch::kJobTokenFd, fd, 0, 1 << 20);
    if (!v.ok()) return v.status();
    options.job_token_fd = *v;
  }
  options.initial_state_dump_dir = Optional(lookup, launch::kDumpInitialState);
  if (const std::string all_reduce = Optional(lookup, launch::kAllReduce); !all_reduce.empty()) {
    if (all_reduce != launch::kAllReduceOverGloo) {
      return absl::InvalidArgumentError(absl::StrCat(launch::kAllReduce, "=", all_reduce, ": the only value is \"",
                                                     launch::kAllReduceOverGloo,
                                                     "\" (sums over Gloo's sockets); unset it for shared memory"));
    }
    options.shared_memory_all_reduce = false;
  }
  const std::string attempt = Optional(lookup, launch::kAttempt);
  if (!attempt.empty()) {
    absl::StatusOr<int> v = ParseInt(launch::kAttempt, attempt, 0, 1 << 30);
    if (!v.ok()) return v.status();
    options.attempt = *v;
  }
  return options;
}

absl::Status TakeJobToken(WorkerOptions& options) {
  if (options.job_token_fd < 0) return absl::OkStatus();
  // Before the token is in memory: from here on only root may look inside this process.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  std::string token;
  char buffer[256];
  ssize_t n;
  while ((n = read(options.job_token_fd, buffer, sizeof(buffer))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || token.size() > 4096) break;
    token.append(buffer, static_cast<size_t>(n));
  }
  close(options.job_token_fd);
  options.job_token_fd = -1;
  unsetenv(launch::kJobTokenFd);
  if (n != 0 || token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(launch::kJobTokenFd, ": no job token could be read from its descriptor"));
  }
  options.job_token = std::move(token);
  return absl::OkStatus();
}

namespace {
std::optional<absl::Time> warm_identity_taken_at;
}  // namespace

std::optional<absl::Time> WarmIdentityTakenAt() { return warm_identity_taken_at; }

absl::Status AwaitWarmIdentity() {
  const char* descriptor = std::getenv(launch::kWarmFd);
  if (descriptor == nullptr) return absl::OkStatus();
  const std::string descriptor_text = descriptor;
  int fd = -1;
  if (!absl::SimpleAtoi(descriptor_text, &fd) || fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(launch::kWarmFd, "=", descriptor_text, ": not a descriptor"));
  }
  unsetenv(launch::kWarmFd);
  // Before the identity and the job's token arrive, and for however long this rank idles: from here
  // only root may look inside this process, so another process of its account cannot reopen the
  // pipe through /proc to read the token or to write an identity of its own.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // A byte at a time: what follows the identity is the token, TakeJobToken's to read.
  constexpr size_t kMaxEntry = 64 * 1024;
  std::vector<std::string> entries;
  std::string entry;
  while (true) {
    char c;
    const ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (entries.empty() && entry.empty()) return absl::CancelledError("fitrund let this warm rank go");
      return absl::DataLossError(absl::StrCat(launch::kWarmFd, ": the identity ended before its last entry"));
    }
    if (c != '\0') {
      if (entry.size() >= kMaxEntry) return absl::InvalidArgumentError(absl::StrCat(launch::kWarmFd, ": an entry too long"));
      entry.push_back(c);
    } else if (entry.empty()) {
      break;
    } else {
      entries.push_back(std::move(entry));
      entry.clear();
    }
  }
  if (entries.size() < 2) return absl::InvalidArgumentError(absl::StrCat(launch::kWarmFd, ": no working directory and log"));
  const int log = open(entries[1].c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (log < 0) return absl::FailedPreconditionError(absl::StrCat("cannot open the log ", entries[1], ": ", std::strerror(errno)));
  dup2(log, STDOUT_FILENO);
  dup2(log, STDERR_FILENO);
  close(log);
  if (chdir(entries[0].c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot enter ", entries[0], ": ", std::strerror(errno)));
  }
  for (size_t i = 2; i < entries.size(); ++i) {
    const size_t equals = entries[i].find('=');
    if (equals == std::string::npos || equals == 0) {
      return absl::InvalidArgumentError(absl::StrCat(launch::kWarmFd, ": '", entries[i], "' is not KEY=VALUE"));
    }
    setenv(entries[i].substr(0, equals).c_str(), entries[i].substr(equals + 1).c_str(), 1);
  }
  setenv(launch::kJobTokenFd, descriptor_text.c_str(), 1);
  warm_identity_taken_at = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<fitrun::v1::WorkerAssignment> LoadAssignment(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("FITRUN_ASSIGNMENT: cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  fitrun::v1::WorkerAssignment assignment;
  google::protobuf::TextFormat::Parser parser;
  CollectFirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &assignment)) {
    return absl::InvalidArgumentError(absl::StrCat("FITRUN_ASSIGNMENT: ", path,
                                                   " is not a text-format fitrun.v1.WorkerAssignment: ",
                                                   errors.first()));
  }
  return assignment;
}

absl::StatusOr<PlanDevice> ParsePlanDevice(const std::string& device_id, const std::string& field) {
  absl::string_view rest = device_id;
  PlanDevice device;
  // On a cluster a device is named with its node ("n1/cuda:1"). The scheduler there gives each rank
  // its own GPU and hides the others (Slurm's --gpus-per-task sets CUDA_VISIBLE_DEVICES), so the
  // rank's GPU is the first it sees; a virtual CPU device's index only names its share.
  bool on_a_node = false;
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    rest.remove_prefix(slash + 1);
    on_a_node = true;
  }
  if (absl::ConsumePrefix(&rest, "cpu:")) {
    device.kind = PlanDevice::Kind::kCpu;
  } else if (absl::ConsumePrefix(&rest, "cuda:") || absl::ConsumePrefix(&rest, "gpu:")) {
    device.kind = PlanDevice::Kind::kCuda;
  } else {
    rest = "";
  }
  // A slice of a GPU ("cuda:0#1", fitrund's --devices=cuda:0@SIZExCOUNT) is on that GPU.
  if (device.kind == PlanDevice::Kind::kCuda) {
    if (const size_t hash = rest.find('#'); hash != absl::string_view::npos) {
      int slice = 0;
      if (!absl::SimpleAtoi(rest.substr(hash + 1), &slice) || slice < 0) rest = "";
      rest = rest.substr(0, hash);
    }
  }
  if (rest.empty() || !absl::SimpleAtoi(rest, &device.index) || device.index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", device_id, "\" is not a device; expected cpu:N or cuda:N (NODE/cpu:N on a cluster)"));
  }
  if (on_a_node && device.kind == PlanDevice::Kind::kCuda) device.index = 0;
  return device;
}

absl::Status ValidateAssignment(const fitrun::v1::WorkerAssignment& a, const WorkerOptions& o) {
  const fitrun::v1::JobSpec& spec = a.spec();
  const fitrun::v1::Plan& plan = a.plan();
  if (plan.device_ids_size() != o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("plan.device_ids: has ", plan.device_ids_size(),
                                                   " devices but WORLD_SIZE is ", o.world_size));
  }
  if (absl::Status s = ParsePlanDevice(plan.device_ids(o.rank), absl::StrCat("plan.device_ids[", o.rank, "]"))
                           .status();
      !s.ok()) {
    return s;
  }
  if (!o.job_id.empty() && !a.job_id().empty() && a.job_id() != o.job_id) {
    return absl::InvalidArgumentError(absl::StrCat("job_id: the assignment is for job \"", a.job_id(),
                                                   "\" but ", launch::kJobId, " is \"", o.job_id, "\""));
  }
  if (spec.has_script()) {
    if (spec.script().command().empty()) {
      return absl::InvalidArgumentError("spec.script.command: empty (an argv such as [/usr/bin/python3, train.py])");
    }
  } else if (!fitrun::v1::DataKind_IsValid(spec.data().kind())) {
    // Whether the kind suits the model is the workload loader's to say (worker/models/workload.h).
    return absl::InvalidArgumentError(
        absl::StrCat("spec.data.kind: unsupported (", static_cast<int>(spec.data().kind()), ")"));
  }
  if (!spec.has_script() && spec.data().path().empty()) {
    return absl::InvalidArgumentError("spec.data.path: empty (the dataset's directory or file)");
  }
  if (a.cpu_threads_size() != 0 && a.cpu_threads_size() != o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("cpu_threads: has ", a.cpu_threads_size(),
                                                   " entries, expected one per rank (", o.world_size, ")"));
  }
  if (a.cpu_threads_size() != 0 && a.cpu_threads(o.rank) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads[", o.rank, "]: must be >= 0 (got ", a.cpu_threads(o.rank), ")"));
  }
  if (a.memory_cap_bytes_size() != 0 && a.memory_cap_bytes_size() != o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("memory_cap_bytes: has ", a.memory_cap_bytes_size(),
                                                   " entries, expected one per rank (", o.world_size, ")"));
  }
  if (spec.ddp().collective_timeout_seconds() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.ddp.collective_timeout_seconds: must be >= 0 (got ",
                                                   spec.ddp().collective_timeout_seconds(), ")"));
  }
  if (!fitrun::v1::CommHook_IsValid(spec.ddp().comm_hook())) {
    return absl::InvalidArgumentError(absl::StrCat("spec.ddp.comm_hook: unsupported (",
                                                   static_cast<int>(spec.ddp().comm_hook()),
                                                   "); this worker knows none, fp16, bf16 and powersgd"));
  }
  const fitrun::v1::FaultInjection& fault = spec.fault_injection();
  if (fault.kind() != fitrun::v1::FaultInjection::KIND_UNSPECIFIED) {
    if (fault.at_step() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.fault_injection.at_step: must be >= 1 (got ", fault.at_step(), ")"));
    }
    if (fault.rank() < 0 || fault.rank() >= o.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("spec.fault_injection.rank: ", fault.rank(),
                                                     " is not a rank of a world of ", o.world_size));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RankResources> ResourcesOf(const fitrun::v1::WorkerAssignment& assignment, int rank) {
  RankResources resources = ProbeResourcesOf(assignment);
  if (rank < 0 || rank >= assignment.plan().device_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan.device_ids: has no device for rank ", rank));
  }
  resources.device_id = assignment.plan().device_ids(rank);
  resources.device_field = absl::StrCat("plan.device_ids[", rank, "]");
  absl::StatusOr<PlanDevice> device = ParsePlanDevice(resources.device_id, resources.device_field);
  if (!device.ok()) return device.status();
  resources.device = *device;
  resources.memory_cap_bytes = rank < assignment.memory_cap_bytes_size() ? std::max<int64_t>(0, assignment.memory_cap_bytes(rank)) : 0;
  resources.cpu_threads = rank < assignment.cpu_threads_size() && assignment.cpu_threads(rank) > 0
                              ? assignment.cpu_threads(rank)
                              : 1;
  return resources;
}

RankResources ProbeResourcesOf(const fitrun::v1::WorkerAssignment& assignment) {
  RankResources resources;
  resources.device_id = "cpu:0";
  resources.memory_cap_bytes =
      assignment.memory_cap_bytes_size() > 0 ? std::max<int64_t>(0, assignment.memory_cap_bytes(0)) : 0;
  resources.cpu_threads =
      assignment.cpu_threads_size() > 0 && assignment.cpu_threads(0) > 0 ? assignment.cpu_threads(0) : 1;
  return resources;
}

absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  CommandLine command_line;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--probe") {
      command_line.probe = true;
    } else if (absl::StartsWith(arg, "--probe_batches=")) {
      const std::string value = arg.substr(std::string("--probe_batches=").size());
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int64_t batch = 0;
        if (!absl::SimpleAtoi(part, &batch) || batch < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--probe_batches: expected micro-batch sizes B1,B2,... each >= 1 (got \"", value, "\")"));
        }
        command_line.probe_batches.push_back(batch);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument \"", arg, "\""));
    }
  }
  if (!command_line.probe_batches.empty() && !command_line.probe) {
    return absl::InvalidArgumentError("--probe_batches: only meaningful with --probe");
  }
  return command_line;
}

}  // namespace fitrun::worker
