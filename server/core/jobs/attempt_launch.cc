#include "server/core/jobs/attempt_launch.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/contract/launch_contract.h"
#include "server/core/jobs/job_directory.h"
#include "server/core/specs/job_specs.h"
#include "server/core/specs/workloads.h"
#include "server/core/units.h"
#include "server/sandbox/owned_directory.h"
#include "fitrun/v1/worker.pb.h"

namespace fitrun::server {

namespace launch = fitrun::contract::launch;


int64_t HostMemoryPerRank(const fitrun::v1::JobSpec& spec, int64_t default_bytes, int64_t ceiling) {
  if (!spec.resources().host_memory().empty()) {
    // Validated at submit, against the ceiling too.
    absl::StatusOr<int64_t> bytes = ParseByteSize(spec.resources().host_memory());
    if (bytes.ok()) return *bytes;
  }
  return ceiling > 0 ? std::min(default_bytes, ceiling) : default_bytes;
}

int64_t DefaultRankHostMemory(const fitrun::v1::Device& device) {
  if (device.kind() == fitrun::v1::DEVICE_KIND_CUDA) return kGpuRankHostBytes;
  return device.total_bytes() + kRankProcessHostBytes;
}

int64_t ProcessesPerRank(const fitrun::v1::JobSpec& spec) {
  return spec.resources().max_processes() > 0 ? spec.resources().max_processes() : kDefaultProcessesPerRank;
}

namespace {

// What every rank of the attempt reads at start (its assignment file): the spec as planned, the plan,
// where checkpoints and the dataset cache are, and each rank's memory cap and threads. `by_id` holds
// the devices by id (a plan's device it lacks reads as an empty one, as below).
fitrun::v1::WorkerAssignment AssignmentFor(const fitrun::v1::Job& job, int attempt, const fitrun::v1::Plan& plan,
                                           std::map<std::string, fitrun::v1::Device>& by_id,
                                           const std::string& job_dir, const std::string& dataset_cache_dir) {
  fitrun::v1::WorkerAssignment assignment;
  assignment.set_job_id(job.id());
  assignment.set_attempt(attempt);
  // The plan's strategy written in: the ranks build the model it chose.
  *assignment.mutable_spec() = SpecAsPlanned(job.spec(), plan);
  *assignment.mutable_plan() = plan;
  assignment.set_checkpoint_dir((std::filesystem::path(job_dir) / kCheckpointsDirectoryName).string());
  assignment.set_dataset_cache_dir(dataset_cache_dir);
  for (const std::string& id : plan.device_ids()) {
    const fitrun::v1::Device& device = by_id[id];
    // A virtual CPU device's whole memory; a GPU slice's cap on its caching allocator; a whole GPU
    // none (the device itself is the limit).
    assignment.add_memory_cap_bytes(device.kind() == fitrun::v1::DEVICE_KIND_CPU ? device.total_bytes()
                                                                                 : device.slice_bytes());
    assignment.add_cpu_threads(std::max(1, device.cpu_threads()));
  }
  return assignment;
}

// One rank's process: its program, directory, log, account and environment.
WorkerLaunch RankLaunch(const fitrun::v1::Job& job, const std::string& token, int attempt, const fitrun::v1::Plan& plan,
                        int rank, std::map<std::string, fitrun::v1::Device>& by_id, const std::string& job_dir,
                        const std::string& assignment_path, const std::optional<UnixAccount>& run_as,
                        const AttemptLaunchSettings& settings) {
  WorkerLaunch launch;
  launch.job_id = job.id();
  launch.attempt = attempt;
  launch.rank = rank;
  launch.argv = {job.spec().has_script() && !settings.script_binary.empty() ? settings.script_binary
                                                                           : settings.worker_binary};
  launch.working_dir = (std::filesystem::path(job_dir) / AttemptDirectoryName(attempt)).string();
  launch.log_path = (std::filesystem::path(job_dir) / RankLogName(attempt, rank)).string();
  launch.run_as = run_as;
  launch.job_token = token;
  launch.env = {
      {launch::kRank, absl::StrCat(rank)},
      {launch::kLocalRank, absl::StrCat(rank)},
      {launch::kWorldSize, absl::StrCat(plan.device_ids_size())},
      {launch::kLocalWorldSize, absl::StrCat(plan.device_ids_size())},
      {launch::kCoordinator, settings.worker_channel_address},
      {launch::kJobId, job.id()},
      {launch::kAttempt, absl::StrCat(attempt)},
      {launch::kAssignment, assignment_path},
  };
  if (!settings.worker_tls_ca.empty()) launch.env.emplace_back(launch::kTlsCa, settings.worker_tls_ca);
  // A built-in job's BLAS threads, its device's share of the cores; a script's are the script's.
  if (!job.spec().has_script()) {
    launch.env.emplace_back(launch::kOpenBlasThreads, absl::StrCat(std::max(1, by_id[plan.device_ids(rank)].cpu_threads())));
  }
  // The caching allocator's settings the plan assumed (CUDA devices only).
  if (!plan.cuda_allocator_config().empty()) {
    launch.env.emplace_back(launch::kCudaAllocatorConfig, plan.cuda_allocator_config());
  }
  return launch;
}

}  // namespace

absl::StatusOr<AttemptLaunch> AssembleAttempt(const fitrun::v1::Job& job, const std::string& token, int attempt,
                                              const fitrun::v1::Plan& plan,
                                              const std::vector<fitrun::v1::Device>& devices,
                                              const std::string& job_dir, const AttemptLaunchSettings& settings) {
  namespace fs = std::filesystem;
  const std::string attempt_name = AttemptDirectoryName(attempt);
  std::optional<UnixAccount> run_as;
  std::string dataset_cache_dir = settings.dataset_cache_dir;
  if (!job.run_as().empty()) {
    absl::StatusOr<UnixAccount> account = LookUpUnixAccount(job.run_as());
    if (!account.ok()) return account.status();
    run_as = *account;
    if (!dataset_cache_dir.empty()) {
      absl::StatusOr<std::string> own = AccountSubdirectory(dataset_cache_dir, *account);
      if (!own.ok()) return own.status();
      dataset_cache_dir = *own;
    }
  }
  // The job's directory is its owner's (0700) from its first attempt on, and whatever its processes
  // left there is theirs: every name below is made and written as the owner, through no symlink.
  absl::StatusOr<OwnedDirectory> directory = OwnedDirectory::Open(job_dir, run_as, /*create=*/true);
  if (!directory.ok()) return directory.status();
  for (const char* dir : {attempt_name.c_str(), kCheckpointsDirectoryName}) {
    if (absl::Status made = directory->MakeDirectory(dir); !made.ok()) return made;
  }

  // Devices by id, for each rank's memory cap and thread share.
  std::map<std::string, fitrun::v1::Device> by_id;
  for (const fitrun::v1::Device& device : devices) by_id[device.id()] = device;

  std::string assignment_text;
  google::protobuf::TextFormat::PrintToString(AssignmentFor(job, attempt, plan, by_id, job_dir, dataset_cache_dir),
                                              &assignment_text);
  const std::string assignment_name = absl::StrCat(attempt_name, "/", kAssignmentFileName);
  if (absl::Status written = directory->WriteFile(assignment_name, assignment_text, 0600); !written.ok()) {
    return written;
  }
  const fs::path assignment_path = fs::path(job_dir) / assignment_name;

  AttemptLaunch launches;
  launches.job_id = job.id();
  launches.attempt = attempt;
  launches.job_dir = job_dir;
  launches.attempt_dir_name = attempt_name;
  launches.nodes.assign(plan.nodes().begin(), plan.nodes().end());
  launches.ranks_per_node = plan.devices_per_node();
  launches.time_limit_minutes = job.spec().resources().time_limit_minutes();
  if (plan.device_ids_size() > 0) {
    const fitrun::v1::Device& first = by_id[plan.device_ids(0)];
    launches.cpus_per_rank = std::max(1, first.cpu_threads());
    launches.gpu_per_rank = first.kind() == fitrun::v1::DEVICE_KIND_CUDA;
    // A virtual CPU device's memory is host memory; the spec's host memory, when it says, is what
    // a rank asks for.
    if (first.kind() == fitrun::v1::DEVICE_KIND_CPU) launches.memory_per_rank_bytes = first.total_bytes();
    if (!job.spec().resources().host_memory().empty()) {
      launches.memory_per_rank_bytes =
          HostMemoryPerRank(job.spec(), DefaultRankHostMemory(first), settings.max_rank_host_memory_bytes);
    }
  }
  const int world_size = plan.device_ids_size();
  for (const std::string& id : plan.device_ids()) {
    launches.host_memory_limit_bytes +=
        HostMemoryPerRank(job.spec(), DefaultRankHostMemory(by_id[id]), settings.max_rank_host_memory_bytes);
    launches.max_processes += ProcessesPerRank(job.spec());
  }
  for (int rank = 0; rank < world_size; ++rank) {
    launches.ranks.push_back(RankLaunch(job, token, attempt, plan, rank, by_id, job_dir, assignment_path.string(),
                                        run_as, settings));
  }
  return launches;
}

absl::StatusOr<LaunchedAttempt> StartRanks(PendingLaunch& launch, const std::string& job_dir,
                                           const AttemptLaunchSettings& settings, WorkerLauncher& launcher) {
  const absl::Time assembly_start = absl::Now();
  absl::StatusOr<AttemptLaunch> assembled =
      AssembleAttempt(launch.job, launch.token, launch.attempt, launch.job.plan(), launch.devices, job_dir, settings);
  if (!assembled.ok()) return assembled.status();
  launch.phases.push_back({"job directory", absl::Now() - assembly_start});
  assembled->on_allocation = launch.on_allocation;
  absl::StatusOr<LaunchedAttempt> launched = launcher.Launch(*assembled, launch.on_exit);
  if (!launched.ok()) return absl::InternalError(absl::StrCat("launching the ranks: ", launched.status().message()));
  launch.phases.insert(launch.phases.end(), launched->phases.begin(), launched->phases.end());
  return launched;
}

std::string FormatLaunchPhases(const std::vector<LaunchPhase>& phases) {
  absl::Duration total;
  std::vector<std::string> parts;
  for (const LaunchPhase& phase : phases) {
    total += phase.took;
    parts.push_back(absl::StrFormat("%s %.1f ms", phase.name, absl::ToDoubleMilliseconds(phase.took)));
  }
  return absl::StrFormat("in %.1f ms: %s", absl::ToDoubleMilliseconds(total), absl::StrJoin(parts, ", "));
}

}  // namespace fitrun::server
