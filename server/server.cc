#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/contract/atomic_file.h"
#include "proto/contract/free_port.h"
#include "proto/contract/install_layout.h"
#include "proto/contract/log.h"
#include "server/core/specs/job_specs.h"
#include "server/core/units.h"
#include "server/devices/gpu_offer.h"
#include "server/devices/nvml_devices.h"
#include "server/devices/virtual_cpu_devices.h"
#include "server/sandbox/unix_account.h"
#include "server/slurm/slurm_devices.h"
#include "server/slurm/slurm_text.h"

namespace fitrun::server {
namespace {

// --worker_binary's default: worker/fitrun-worker under fitrund's layout root (proto/contract/install_layout.h:
// bazel-bin/ for bazel-bin/server/fitrund, /usr/lib/fitrun/ for the package's /usr/bin/fitrund).
std::string DefaultWorkerBinary() {
  namespace layout = fitrun::contract::layout;
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "fitrun-worker";
  const std::vector<std::string> roots = layout::RootsOf(self.string(), /*from_worker=*/false);
  const std::string found = layout::FindUnder(roots, layout::kWorker);
  return found.empty() ? roots.front() + "/" + layout::kWorker : found;
}

// Takes <state_dir>/fitrund.lock for this process and writes its pid there, or says who holds it.
// The descriptor is close-on-exec: ranks, which outlive a fitrund, must not keep its lock.
absl::StatusOr<int> LockStateDir(const std::string& state_dir) {
  const std::string path = (std::filesystem::path(state_dir) / "fitrund.lock").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("--state_dir: cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char pid[32] = {};
    const ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
    close(fd);
    if (error != EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat("--state_dir: cannot lock ", path, ": ", std::strerror(error)));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir: ", state_dir, " is in use by another fitrund (pid ",
        n > 0 ? std::string(absl::StripAsciiWhitespace(pid)) : "unknown", ", holding ", path,
        "); stop it, or give this one another --state_dir"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("--state_dir: cannot write ", path));
  }
  return fd;
}

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1" ||
         host.rfind("127.", 0) == 0 || host.rfind("unix:", 0) == 0;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  std::stringstream pem;
  pem << in.rdbuf();
  if (!in || pem.str().empty()) return absl::FailedPreconditionError(absl::StrCat(flag, ": cannot read ", path));
  return pem.str();
}

// The gRPC server's credentials from the TLS flags, or plain text (refused off loopback unless
// --insecure).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const ServerOptions& options,
                                                                          const std::string& host) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key: give both, or neither");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) return absl::InvalidArgumentError("--tls_client_ca: needs --tls_cert and --tls_key");
    if (!IsLoopback(host) && !options.insecure) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen: ", host, " is not a loopback address, and without TLS anyone who can reach it would read every "
          "job and its tokens in plain text: give --tls_cert and --tls_key, or pass --insecure to serve it anyway"));
    }
    return grpc::InsecureServerCredentials();
  }
  absl::StatusOr<std::string> cert = ReadPem(options.tls_cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(options.tls_key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> client_ca = ReadPem(options.tls_client_ca, "--tls_client_ca");
    if (!client_ca.ok()) return client_ca.status();
    ssl.pem_root_certs = *client_ca;
    // Ranks and token holders connect without a certificate; one that is presented must verify.
    ssl.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// The metrics port carries what the gRPC port does (every job in local mode; tokens and session
// cookies when secured). With --tls_cert it serves HTTPS with the same certificate (and client
// certificates with --tls_client_ca); without, plain HTTP, which off loopback needs --insecure.
absl::Status CheckMetricsListen(const ServerOptions& options) {
  const size_t colon = options.metrics_listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_listen: expected HOST:PORT, e.g. 127.0.0.1:9464 (got '",
                                                   options.metrics_listen, "')"));
  }
  const std::string host = options.metrics_listen.substr(0, colon);
  if (!options.tls_cert.empty() || IsLoopback(host) || options.insecure) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--metrics_listen: ", host, " is not a loopback address, and without TLS anyone on the way would read the "
      "page's tokens and session cookies, and the jobs it shows: give --tls_cert and --tls_key (both ports then "
      "serve TLS), or pass --insecure to serve it anyway"));
}

// --cluster=slurm: the cluster's devices, the Slurm launcher, and where jobs' files go. Every flag
// is checked, and slurmctld reached, before fitrund serves anything.
absl::Status StartSlurm(const ServerOptions& options, RunningServer* server, JobManager::Options* manager_options) {
  absl::StatusOr<std::map<std::string, int64_t>> gpu_memory = slurm::ParseGpuMemoryFlag(options.slurm_gpu_memory);
  if (!gpu_memory.ok()) return gpu_memory.status();
  slurm::SlurmDevices::Options device_options;
  device_options.partition = options.slurm_partition;
  device_options.gpu_memory = *std::move(gpu_memory);
  if (!options.slurm_virtual_devices.empty()) {
    absl::StatusOr<std::pair<int, int64_t>> virtual_devices =
        slurm::ParseVirtualDevicesFlag(options.slurm_virtual_devices);
    if (!virtual_devices.ok()) return virtual_devices.status();
    device_options.virtual_devices = *virtual_devices;
  }
  if (options.devices != "auto") {
    return absl::InvalidArgumentError(
        "--devices: not with --cluster=slurm, whose devices come from Slurm (--slurm_gpu_memory, "
        "--slurm_virtual_devices)");
  }

  std::error_code error;
  if (!options.shared_dir.empty()) {
    if (!std::filesystem::is_directory(options.shared_dir, error)) {
      return absl::InvalidArgumentError(absl::StrCat("--shared_dir: ", options.shared_dir,
                                                     " is not a directory; give one every node mounts at that path"));
    }
    const std::filesystem::path shared = std::filesystem::absolute(options.shared_dir, error);
    manager_options->jobs_dir = (shared / "jobs").string();
    // Decoded once for the whole cluster: every node's ranks map the same entries.
    manager_options->dataset_cache_dir = (shared / "datasets").string();
    manager_options->max_nodes = 0;
    const std::filesystem::path shared_worker = shared / "bin" / "fitrun-worker";
    if (options.worker_binary.empty() && std::filesystem::exists(shared_worker, error)) {
      manager_options->worker_binary = shared_worker.string();
    }
  } else {
    manager_options->max_nodes = 1;
    manager_options->max_nodes_reason =
        "plans across nodes need storage every node sees (batch scripts, rank logs, checkpoints): start fitrund "
        "with --shared_dir";
  }

  absl::StatusOr<std::unique_ptr<slurm::SlurmDevices>> devices = slurm::SlurmDevices::Create(device_options);
  if (!devices.ok()) return devices.status();
  server->devices = *std::move(devices);

  SlurmLauncher::Options launcher_options;
  launcher_options.partition = options.slurm_partition;
  launcher_options.account = options.slurm_account;
  launcher_options.extra_sbatch_args = absl::StrSplit(options.slurm_sbatch_args, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  for (const std::string& arg : launcher_options.extra_sbatch_args) {
    if (arg.rfind("-", 0) != 0 && arg.find('=') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slurm_sbatch_args: '", arg, "' is not an sbatch option; give options as --name=value, e.g. "
          "--slurm_sbatch_args='--qos=high --constraint=a100'"));
    }
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  launcher_options.coordinator_tag =
      SlurmLauncher::CoordinatorTag(host, std::filesystem::absolute(options.state_dir, error).string());
  server->launcher = std::make_unique<SlurmLauncher>(std::move(launcher_options));
  return absl::OkStatus();
}

// The machine's task limit: the smaller of kernel.threads-max and pid_max (0 when unreadable).
int64_t MachineTaskLimit() {
  int64_t limit = 0;
  for (const char* path : {"/proc/sys/kernel/threads-max", "/proc/sys/kernel/pid_max"}) {
    std::ifstream in(path);
    int64_t value = 0;
    if (in >> value && value > 0) limit = limit == 0 ? value : std::min(limit, value);
  }
  return limit;
}

// --host_memory, --max_rank_host_memory and --max_rank_processes, with their defaults from the
// machine (`memory`: its physical memory).
absl::Status SetRankCeilings(const ServerOptions& options, int64_t memory, JobManager::Options& manager) {
  for (const auto& [flag, value, out] :
       {std::tuple<const char*, const std::string&, int64_t*>{"--host_memory", options.host_memory,
                                                              &manager.host_memory_bytes},
        {"--max_rank_host_memory", options.max_rank_host_memory, &manager.max_rank_host_memory_bytes}}) {
    if (value.empty()) {
      *out = memory;
      continue;
    }
    absl::StatusOr<int64_t> bytes = ParseByteSize(value);
    if (!bytes.ok() || *bytes < kMinHostMemoryPerRank) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": expected a size of at least ",
                                                     FormatBytes(kMinHostMemoryPerRank), " such as 48GiB (got '",
                                                     value, "')"));
    }
    *out = *bytes;
  }
  // A Slurm cluster's nodes are bounded by Slurm (sbatch --mem), not by this machine's memory.
  if (options.cluster != "local") manager.host_memory_bytes = 0;
  if (options.max_rank_processes < 0 ||
      (options.max_rank_processes > 0 && options.max_rank_processes < kMinProcessesPerRank)) {
    return absl::InvalidArgumentError(absl::StrCat("--max_rank_processes: at least ", kMinProcessesPerRank,
                                                   ", or 0 for the default (got ", options.max_rank_processes, ")"));
  }
  const int64_t tasks = MachineTaskLimit();
  manager.max_rank_processes =
      options.max_rank_processes > 0
          ? options.max_rank_processes
          : std::max<int64_t>(kDefaultProcessesPerRank, std::min<int64_t>(32768, tasks > 0 ? tasks / 4 : 32768));
  return absl::OkStatus();
}

// chmod 0711: its owner's, and a way through for others to what lies inside and is theirs.
absl::Status OnlyTraversable(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  std::filesystem::permissions(dir, std::filesystem::perms(0711), error);
  if (error) return absl::FailedPreconditionError(absl::StrCat("cannot set the mode of ", dir, ": ", error.message()));
  return absl::OkStatus();
}

// Takes gRPC's reflection plugin out of a server's builder: linking its library installs it in
// every server, so leaving it out means removing it.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* args) override { (void)args; }
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(
                                               plugin.get()) != nullptr;
                                  }),
                   plugins->end());
  }
};

// The coordinators running on this machine now, by tag (CoordinatorTag of each fitrund process's
// host and --state_dir, from /proc): a fitrund of any version is seen, whatever it recorded.
std::set<std::string> LiveCoordinatorTags(const std::string& host) {
  std::set<std::string> tags;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", std::filesystem::directory_options::skip_permission_denied)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (ReadProcFile(std::stoi(pid), "comm") != "fitrund\n") continue;
    const std::string text = ReadProcFile(std::stoi(pid), "cmdline");
    const std::vector<std::string> args = absl::StrSplit(text, '\0');
    std::string state_dir = "fitrun-state";  // the flag's default
    for (size_t i = 0; i < args.size(); ++i) {
      absl::string_view arg = absl::StripPrefix(absl::StripPrefix(args[i], "-"), "-");
      if (absl::ConsumePrefix(&arg, "state_dir=")) {
        state_dir = std::string(arg);
      } else if (arg == "state_dir" && i + 1 < args.size()) {
        state_dir = args[i + 1];
      }
    }
    std::error_code error;
    const std::filesystem::path cwd = std::filesystem::read_symlink(entry.path() / "cwd", error);
    if (error) continue;
    // As the process computed it: std::filesystem::absolute, its working directory joined.
    tags.insert(SlurmLauncher::CoordinatorTag(host, (cwd / state_dir).string()));
  }
  return tags;
}

// --job_cgroups: whether attempts' processes get cgroups of their own, said on fitrund's log either
// way. `on` refuses to start without them; `auto` uses them when fitrund is root and may.
absl::Status StartJobCgroups(const ServerOptions& options, RunningServer* server) {
  if (options.job_cgroups != "auto" && options.job_cgroups != "on" && options.job_cgroups != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--job_cgroups: expected auto, on or off (got '", options.job_cgroups, "')"));
  }
  if (options.job_cgroups == "off") return absl::OkStatus();
  if (options.cluster != "local") {
    if (options.job_cgroups == "on") {
      return absl::InvalidArgumentError(
          "--job_cgroups=on: only with --cluster=local; on a Slurm cluster, Slurm confines ranks (its task/cgroup "
          "plugin with --mem)");
    }
    return absl::OkStatus();
  }
  if (options.job_cgroups == "auto" && geteuid() != 0) {
    contract::LogInfo("job cgroups: off (fitrund is not root; --job_cgroups=on to try anyway)");
    return absl::OkStatus();
  }
  JobCgroups::Options cgroup_options;
  cgroup_options.parent = options.cgroup_parent;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::error_code error;
  // The coordinator's identity, as its Slurm allocations carry it: stable across restarts.
  cgroup_options.coordinator_tag =
      SlurmLauncher::CoordinatorTag(host, std::filesystem::absolute(options.state_dir, error).string());
  CgroupSupport support = ProbeCgroupSupport(cgroup_options);
  if (support.cgroups == nullptr) {
    if (options.job_cgroups == "on") {
      return absl::FailedPreconditionError(absl::StrCat("--job_cgroups=on: this machine cannot confine jobs: ",
                                                        support.text, "; or pass --job_cgroups=off"));
    }
    contract::LogWarning("job cgroups: off (%s)", support.text.c_str());
    return absl::OkStatus();
  }
  contract::LogInfo("job cgroups: %s", support.text.c_str());
  server->cgroups = std::move(support.cgroups);
  // What coordinators that died (killed, or unable to empty them) left beside this one's.
  const std::set<std::string> live = LiveCoordinatorTags(host);
  const std::vector<std::string> removed =
      server->cgroups->RemoveGoneCoordinators([&live](const std::string& tag) { return live.count(tag) > 0; });
  if (!removed.empty()) {
    contract::LogInfo("job cgroups: removed %zu empty cgroup(s) of coordinators no longer running (%s%s)",
            removed.size(), removed.front().c_str(), removed.size() > 1 ? ", ..." : "");
  }
  return absl::OkStatus();
}

}  // namespace

bool RunsJobsAsOwners(const ServerOptions& options) {
  return (!options.auth_tokens.empty() || !options.tls_client_ca.empty()) && CanRunAsOtherAccounts() &&
         options.unix_accounts != "none";
}

void RunningServer::Shutdown(bool stop_workers) {
  if (launcher) launcher->ReleaseIdle();  // warm ranks go at once, not after the API's drain
  if (grpc_server) grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  web.reset();
  if (manager) manager->Shutdown();
  if (!stop_workers) {
    // Running attempts keep their cgroups for the next fitrund; this coordinator's directory goes
    // only when none is left (rmdir refuses one that is not empty).
    if (cgroups) (void)cgroups->RemoveDirectories();
    return;
  }
  launcher.reset();  // kills stragglers and joins; their exit callbacks still reach the manager
  manager.reset();
}

namespace startup {

absl::StatusOr<ListenAddress> ResolveListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("--listen: expected HOST:PORT, e.g. 127.0.0.1:7070");
  ListenAddress address;
  address.host = listen.substr(0, colon);
  address.port = listen.substr(colon + 1);
  if (address.port == "0") {
    absl::StatusOr<int> free_port = contract::PickFreeLoopbackPort();
    if (!free_port.ok()) return free_port.status();
    address.port = absl::StrCat(*free_port);
  }
  const std::string& host = address.host;
  address.dial_host = (host == "0.0.0.0" || host == "[::]" || host.empty()) ? "127.0.0.1" : host;
  return address;
}

std::string WorkerChannelAddress(const std::string& advertise_address, const ListenAddress& listen) {
  if (advertise_address.empty()) return absl::StrCat(listen.dial_host, ":", listen.port);
  const bool has_port = advertise_address.find(':') != std::string::npos && advertise_address.back() != ']';
  return has_port ? advertise_address : absl::StrCat(advertise_address, ":", listen.port);
}

absl::Status SetJobLimits(const ServerOptions& options, JobManager::Options& manager) {
  manager.max_open_jobs_per_owner = options.max_jobs_per_user;
  if (options.retain_finished_jobs < 0 || options.max_events_per_job < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.retain_finished_jobs < 0 ? "--retain_finished_jobs" : "--max_events_per_job",
        ": 0 (no bound) or more (got ", std::min(options.retain_finished_jobs, options.max_events_per_job), ")"));
  }
  manager.retain_finished_jobs = options.retain_finished_jobs;
  manager.max_events_per_job = options.max_events_per_job;
  if (options.min_account_uid < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--min_account_uid: at least 1, root's jobs never run as root (got ",
                                                   options.min_account_uid, ")"));
  }
  manager.min_account_uid = static_cast<uid_t>(options.min_account_uid);
  return absl::OkStatus();
}

}  // namespace startup

namespace {

// BuildAndStart's steps, in the order it takes them. Each returns the first error it meets, named
// after its flag; what a step builds it leaves in the RunningServer or the manager's options.

absl::Status CheckUnixAccountsFlag(const ServerOptions& options) {
  if (options.unix_accounts != "listed" && options.unix_accounts != "same_name" && options.unix_accounts != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("--unix_accounts: expected listed, same_name or none (got '", options.unix_accounts, "')"));
  }
  return absl::OkStatus();
}

// The state directory, made and given its mode: 0711 when jobs run as their owners, else 0700.
absl::Status PrepareStateDir(const ServerOptions& options, bool as_owners) {
  // Everything fitrund writes (its database with every job's spec and rank token, logs of its own,
  // caches) is its alone unless it says otherwise below, whoever runs it; the job directories it
  // gives to their owners.
  umask(077);
  std::error_code error;
  std::filesystem::create_directories(options.state_dir, error);
  if (error) return absl::FailedPreconditionError(absl::StrCat("--state_dir: cannot create ", options.state_dir, ": ", error.message()));
  if (as_owners) {
    // Owners pass through to their own job directories (jobs/<id>, theirs, 0700) but list nothing.
    if (absl::Status traversable = OnlyTraversable(options.state_dir); !traversable.ok()) return traversable;
  } else {
    // Its ranks run as fitrund's own user: nobody else needs a way in.
    std::filesystem::permissions(options.state_dir, std::filesystem::perms::owner_all, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state_dir: cannot set the mode of ", options.state_dir, ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

// The state directory's lock, then the job store in it: the store is opened only by its one fitrund.
absl::Status ClaimStateDir(const ServerOptions& options, RunningServer* server) {
  absl::StatusOr<int> lock = LockStateDir(options.state_dir);
  if (!lock.ok()) return lock.status();
  server->state_lock_fd = *lock;
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
      SqliteJobStore::Open((std::filesystem::path(options.state_dir) / "fitrun.db").string());
  if (!store.ok()) return store.status();
  server->store = *std::move(store);
  return absl::OkStatus();
}

// --cluster: on Slurm, the cluster's devices and launcher; locally, no Slurm flag may be given.
absl::Status ChooseCluster(const ServerOptions& options, RunningServer* server, JobManager::Options* manager_options) {
  if (options.cluster == "slurm") return StartSlurm(options, server, manager_options);
  if (options.cluster != "local") {
    return absl::InvalidArgumentError(absl::StrCat("--cluster: expected local or slurm (got '", options.cluster, "')"));
  }
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--slurm_partition", options.slurm_partition},
                                    {"--slurm_account", options.slurm_account},
                                    {"--slurm_sbatch_args", options.slurm_sbatch_args},
                                    {"--slurm_gpu_memory", options.slurm_gpu_memory},
                                    {"--slurm_virtual_devices", options.slurm_virtual_devices},
                                    {"--shared_dir", options.shared_dir}}) {
    if (!value.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": only with --cluster=slurm"));
  }
  return absl::OkStatus();
}

// --devices naming GPUs whole or as slices: the driver's library must see them, and the worker train
// on them.
absl::Status OfferNamedGpus(const ServerOptions& options, RunningServer* server) {
  absl::StatusOr<std::vector<GpuOfferItem>> offer = ParseGpuOffer(options.devices);
  if (!offer.ok()) return offer.status();
  if (!options.worker_cuda) {
    return absl::InvalidArgumentError(absl::StrCat("--devices=", options.devices,
                                                   " needs a fitrun-worker built with CUDA; pass --worker_cuda"));
  }
  absl::StatusOr<std::unique_ptr<NvmlDevices>> gpus = NvmlDevices::Create({});
  if (!gpus.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--devices=", options.devices, ": NVML (the NVIDIA driver's "
                                                      "library) is needed to offer GPUs: ", gpus.status().message()));
  }
  absl::StatusOr<std::unique_ptr<GpuOffer>> offered = GpuOffer::Create(*std::move(offer), *std::move(gpus));
  if (!offered.ok()) return offered.status();
  server->devices = *std::move(offered);
  return absl::OkStatus();
}

// --devices=auto: GPUs only when they can be used (NVML sees them and the worker can train on
// them); otherwise the log says why not and the devices stay unset.
void UseGpusIfTrainable(const ServerOptions& options, RunningServer* server) {
  absl::StatusOr<std::unique_ptr<NvmlDevices>> gpus = NvmlDevices::Create({});
  if (gpus.ok() && !(*gpus)->Snapshot().empty()) {
    if (options.worker_cuda) {
      server->devices = *std::move(gpus);
    } else {
      contract::LogWarning("NVML sees %zu GPU(s), but fitrun-worker trains on CPU devices only (pass --worker_cuda "
              "with a CUDA LibTorch build); using virtual CPU devices",
              (*gpus)->Snapshot().size());
    }
  } else if (!gpus.ok() && !absl::IsNotFound(gpus.status())) {
    contract::LogWarning("NVML: %s; using virtual CPU devices", std::string(gpus.status().message()).c_str());
  }
}

// The device inventory, unless Slurm gave one: named GPUs, usable GPUs, else virtual CPU devices
// over the machine's `cores` and `memory`.
absl::Status ChooseDevices(const ServerOptions& options, int cores, int64_t memory, RunningServer* server) {
  if (server->devices == nullptr && NamesGpus(options.devices)) {
    if (absl::Status status = OfferNamedGpus(options, server); !status.ok()) return status;
  }
  if (server->devices == nullptr && options.devices == "auto") UseGpusIfTrainable(options, server);
  if (server->devices == nullptr) {
    absl::StatusOr<std::unique_ptr<VirtualCpuDevices>> devices =
        VirtualCpuDevices::Create(options.devices, cores, memory);
    if (!devices.ok()) return devices.status();
    server->devices = *std::move(devices);
  }
  return absl::OkStatus();
}

// The gRPC users: tokens (--auth_tokens) and, with --tls_client_ca, client certificates.
absl::Status StartAuthenticator(const ServerOptions& options, RunningServer* server) {
  Authenticator::Options auth_options{options.auth_tokens, !options.tls_client_ca.empty()};
  auth_options.same_name_accounts = options.unix_accounts == "same_name";
  absl::StatusOr<std::unique_ptr<Authenticator>> authenticator = Authenticator::Create(auth_options);
  if (!authenticator.ok()) return authenticator.status();
  server->authenticator = *std::move(authenticator);
  return absl::OkStatus();
}

// On this machine (no Slurm launcher chosen): ranks started as local processes, in the job cgroups
// when there are any, and kept warm up to --warm_ranks.
absl::Status StartLocalLauncher(const ServerOptions& options, const std::string& worker_binary, RunningServer* server) {
  if (server->launcher != nullptr) return absl::OkStatus();
  LocalLauncher::Options launcher_options;
  launcher_options.cgroups = server->cgroups.get();
  if (options.warm_ranks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--warm_ranks: 0 (none) or more (got ", options.warm_ranks, ")"));
  }
  launcher_options.warm_ranks = options.warm_ranks;
  launcher_options.worker_binary = worker_binary;
  server->launcher = std::make_unique<LocalLauncher>(std::move(launcher_options));
  return absl::OkStatus();
}

// --data_roots, or by default Debian's datasets and <state_dir>/uploads (made here); never '/'.
absl::StatusOr<std::vector<std::string>> DataRoots(const ServerOptions& options, bool as_owners) {
  std::vector<std::string> data_roots = options.data_roots;
  if (data_roots.empty()) {
    std::error_code error;
    const std::filesystem::path uploads = std::filesystem::path(options.state_dir) / "uploads";
    std::filesystem::create_directories(uploads, error);
    // A data root: what users may read there, their own rights decide.
    if (as_owners) std::filesystem::permissions(uploads, std::filesystem::perms(0755), error);
    data_roots = {"/usr/share/datasets", uploads.string()};
  }
  for (const std::string& root : data_roots) {
    if (std::filesystem::path(root).lexically_normal() == "/") {
      return absl::InvalidArgumentError(
          "--data_roots: '/' would let specs name any file fitrund's users can read; name the folders that hold "
          "datasets, models and scripts");
    }
  }
  return data_roots;
}

// Where ranks find what they read: fitrund's CA, the state and dataset-cache directories, the
// worker and, when installed beside it, fitrun-supervisor.
void SetWorkerFiles(const ServerOptions& options, const std::string& worker_binary, JobManager::Options& manager) {
  if (!options.tls_cert.empty()) {
    manager.worker_tls_ca = std::filesystem::absolute(options.tls_ca.empty() ? options.tls_cert : options.tls_ca);
  }
  manager.state_dir = options.state_dir;
  if (manager.dataset_cache_dir.empty()) {
    std::error_code error;
    manager.dataset_cache_dir = (std::filesystem::absolute(options.state_dir, error) / "datasets").string();
  }
  if (manager.worker_binary.empty()) manager.worker_binary = worker_binary;
  // Script jobs run under fitrun-supervisor when it is installed beside the worker: it loads no
  // LibTorch, so a script keeps the machine's own PyTorch to itself.
  std::error_code error;
  const std::filesystem::path supervisor = std::filesystem::path(manager.worker_binary).parent_path() / "fitrun-supervisor";
  if (std::filesystem::exists(supervisor, error)) manager.script_binary = supervisor.string();
}

// Where ranks dial the WorkerChannel, with a warning on Slurm when only this machine can reach it.
void SetWorkerChannel(const ServerOptions& options, const startup::ListenAddress& listen, JobManager::Options& manager) {
  manager.worker_channel_address = startup::WorkerChannelAddress(options.advertise_address, listen);
  if (options.advertise_address.empty() && options.cluster == "slurm" && IsLoopback(listen.dial_host)) {
    contract::LogWarning("ranks on Slurm nodes will dial %s, a loopback address: only ranks on this machine reach it "
            "(give --advertise_address and a --listen address the nodes can reach)",
            manager.worker_channel_address.c_str());
  }
}

std::string ProbesDir(const ServerOptions& options) {
  return (std::filesystem::path(options.state_dir) / "memory-probes").string();
}

// Directories holding what is the owners' (job directories, their dataset caches, their probes'
// assignments): fitrund's, passable, not listable.
absl::Status ProtectOwnersDirs(const ServerOptions& options, const JobManager::Options& manager) {
  const std::string jobs_dir =
      manager.jobs_dir.empty() ? (std::filesystem::path(options.state_dir) / "jobs").string() : manager.jobs_dir;
  for (const std::string& dir : {jobs_dir, manager.dataset_cache_dir, ProbesDir(options)}) {
    if (absl::Status traversable = OnlyTraversable(dir); !traversable.ok()) return traversable;
  }
  return absl::OkStatus();
}

// The job manager's options from the flags: what specs may read, the limits, where ranks find their
// files and fitrund, and (as owners) the owners' directories made passable.
absl::Status DeriveManagerOptions(const ServerOptions& options, bool as_owners, int64_t memory,
                                  const startup::ListenAddress& listen, const std::string& worker_binary,
                                  JobManager::Options& manager) {
  absl::StatusOr<std::vector<std::string>> data_roots = DataRoots(options, as_owners);
  if (!data_roots.ok()) return data_roots.status();
  manager.data_roots.emplace(*std::move(data_roots));
  if (absl::Status limits = startup::SetJobLimits(options, manager); !limits.ok()) return limits;
  if (absl::Status ceilings = SetRankCeilings(options, memory, manager); !ceilings.ok()) return ceilings;
  SetWorkerFiles(options, worker_binary, manager);
  SetWorkerChannel(options, listen, manager);
  manager.stop_workers_on_shutdown = options.stop_workers_on_exit;
  if (as_owners) return ProtectOwnersDirs(options, manager);
  return absl::OkStatus();
}

// --memory_probe: the probe that measures a workload once, and the calibrator that learns from it,
// handed to the manager.
absl::Status StartMemoryProbe(const ServerOptions& options, RunningServer* server, JobManager::Options& manager) {
  if (!options.memory_probe) return absl::OkStatus();
  ProcessMemoryProbe::Options probe_options;
  probe_options.worker_binary = manager.worker_binary;
  probe_options.script_binary = manager.script_binary;
  probe_options.work_dir = ProbesDir(options);
  probe_options.dataset_cache_dir = manager.dataset_cache_dir;
  probe_options.cgroups = server->cgroups.get();
  // Measure with the threads a rank gets, since intra-op threads take scratch memory of their own.
  const std::vector<fitrun::v1::Device> inventory = server->devices->Snapshot();
  probe_options.cpu_threads = inventory.empty() ? 1 : std::max(1, inventory.front().cpu_threads());
  probe_options.probe_device_id = ProbeDeviceOf(inventory);
  absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> probe = ProcessMemoryProbe::Create(probe_options);
  if (!probe.ok()) return probe.status();
  server->memory_probe = *std::move(probe);
  MemoryCalibrator::Options calibrator_options;
  calibrator_options.cache_path = (std::filesystem::path(options.state_dir) / "memory_calibration.tsv").string();
  calibrator_options.metrics = server->metrics.get();
  absl::StatusOr<std::unique_ptr<MemoryCalibrator>> calibrator =
      MemoryCalibrator::Create(calibrator_options, server->memory_probe.get());
  if (!calibrator.ok()) return calibrator.status();
  server->memory_calibrator = *std::move(calibrator);
  manager.memory_calibrator = server->memory_calibrator.get();
  return absl::OkStatus();
}

// What GPU runs teach about each GPU model's costs beyond the tensors, and the caching allocator's
// settings ranks on GPUs run with: fitrund's own environment's, or expandable segments.
absl::Status OpenDeviceCosts(const ServerOptions& options, RunningServer* server, JobManager::Options& manager) {
  absl::StatusOr<std::unique_ptr<DeviceCostsBook>> device_costs =
      DeviceCostsBook::Create((std::filesystem::path(options.state_dir) / "device_costs.tsv").string());
  if (!device_costs.ok()) return device_costs.status();
  server->device_costs = *std::move(device_costs);
  manager.device_costs = server->device_costs.get();
  if (const char* allocator_config = std::getenv("PYTORCH_CUDA_ALLOC_CONF"); allocator_config != nullptr) {
    manager.cuda_allocator_config = allocator_config;
  }
  return absl::OkStatus();
}

absl::Status StartJobManager(const JobManager::Options& manager_options, RunningServer* server) {
  absl::StatusOr<std::unique_ptr<JobManager>> manager = JobManager::Create(
      manager_options, server->store.get(), server->devices.get(), server->launcher.get(), server->metrics.get());
  if (!manager.ok()) return manager.status();
  server->manager = *std::move(manager);
  return absl::OkStatus();
}

// /metrics, the web page and its API on --metrics_listen, behind the gRPC API's users.
absl::Status StartWebServer(const ServerOptions& options, RunningServer* server) {
  WebServer::Options web_options;
  web_options.listen = options.metrics_listen;
  if (absl::Status status = CheckMetricsListen(options); !status.ok()) return status;
  web_options.authenticator = server->authenticator.get();
  web_options.metrics_public = options.metrics_public;
  web_options.hosts = options.metrics_hosts;
  web_options.tls = WebTls{options.tls_cert, options.tls_key, options.tls_client_ca};
  absl::StatusOr<std::unique_ptr<WebServer>> web = WebServer::Start(web_options, server->manager.get(), {server->registry});
  if (!web.ok()) return web.status();
  server->web = *std::move(web);
  server->metrics_address = server->web->address();
  return absl::OkStatus();
}

// The gRPC services (the coordinator's API and the ranks' WorkerChannel) on server->address; a port
// that cannot be bound shuts down what was started.
absl::Status StartGrpcServer(const ServerOptions& options, bool as_owners,
                             const std::shared_ptr<grpc::ServerCredentials>& credentials, RunningServer* server) {
  CoordinatorService::Options service_options;
  service_options.max_streams_per_user = options.max_streams_per_user;
  service_options.run_jobs_as_owners = as_owners;
  if (server->authenticator->secured()) service_options.authenticator = server->authenticator.get();
  server->coordinator_service = std::make_unique<CoordinatorService>(server->manager.get(), service_options);
  server->worker_service = std::make_unique<WorkerChannelService>(server->manager.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Bounded requests: a message is at most 4 MiB (a spec is far less: see kMaxSpecBytes), and a
  // client may not ping more often than every 10 s without calls in flight (twice and it is cut off);
  // a connection is probed every 2 minutes so that a vanished client's streams end.
  builder.SetMaxReceiveMessageSize(4 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 120000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  // gRPC binds with SO_REUSEPORT by default, which would let a second fitrund share the port and take
  // half of the first one's connections: a port in use must stop the start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Reflection lists every method and message to anyone who connects, before any credential is
  // asked for: for a local fitrund's tools only, never a secured one's.
  if (server->authenticator->secured()) builder.SetOption(std::make_unique<WithoutReflection>());
  int bound_port = 0;
  builder.AddListeningPort(server->address, credentials, &bound_port);
  builder.RegisterService(server->coordinator_service.get());
  builder.RegisterService(server->worker_service.get());
  server->grpc_server = builder.BuildAndStart();
  if (server->grpc_server == nullptr || bound_port == 0) {
    server->Shutdown(/*stop_workers=*/true);
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on ", server->address));
  }
  return absl::OkStatus();
}

// Tools and tests started with port 0 learn the ports from these files, written whole after the
// server listens, so a watcher of a file never reads half.
absl::Status WriteAddressFiles(const ServerOptions& options, const RunningServer& server) {
  const std::filesystem::path state(options.state_dir);
  if (absl::Status status = contract::WriteFileAtomically((state / "fitrund.address").string(), server.address + "\n"); !status.ok()) {
    return status;
  }
  return contract::WriteFileAtomically((state / "fitrund.metrics_address").string(), server.metrics_address + "\n");
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunningServer>> BuildAndStart(const ServerOptions& options) {
  auto server = std::make_unique<RunningServer>();
  // First, with nothing made yet: whether jobs run as their owners decides every mode below.
  if (absl::Status status = CheckUnixAccountsFlag(options); !status.ok()) return status;
  const bool as_owners = RunsJobsAsOwners(options);
  // The state directory before anything is written into it.
  if (absl::Status status = PrepareStateDir(options, as_owners); !status.ok()) return status;
  // The lock before the store, so two fitrunds never recover the same jobs.
  if (absl::Status status = ClaimStateDir(options, server.get()); !status.ok()) return status;

  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  JobManager::Options manager_options;
  // The cluster first: Slurm brings its own devices, launcher and job directories.
  if (absl::Status status = ChooseCluster(options, server.get(), &manager_options); !status.ok()) return status;
  // Then this machine's devices, where Slurm gave none.
  if (absl::Status status = ChooseDevices(options, cores, memory, server.get()); !status.ok()) return status;
  // The registry before the parts that report to it (the calibrator, the manager).
  server->registry = std::make_shared<prometheus::Registry>();
  server->metrics = std::make_unique<PrometheusMetrics>(*server->registry, kFitrundVersion, absl::Now());

  // Workers must be told the coordinator's address before the gRPC server (which needs the manager)
  // is built, so a port 0 is resolved to a concrete free port first.
  absl::StatusOr<startup::ListenAddress> listen = startup::ResolveListen(options.listen);
  if (!listen.ok()) return listen.status();
  server->address = listen->address();
  // Credentials and users before the launcher: a bad TLS or token file stops the start before any rank.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(options, listen->host);
  if (!credentials.ok()) return credentials.status();
  if (absl::Status status = StartAuthenticator(options, server.get()); !status.ok()) return status;

  // The cgroups before the launcher and the probe, which start processes in them.
  if (absl::Status status = StartJobCgroups(options, server.get()); !status.ok()) return status;
  const std::string worker_binary = options.worker_binary.empty() ? DefaultWorkerBinary() : options.worker_binary;
  if (absl::Status status = StartLocalLauncher(options, worker_binary, server.get()); !status.ok()) return status;
  // The manager's options once the cluster, the address and the worker are known.
  if (absl::Status status = DeriveManagerOptions(options, as_owners, memory, *listen, worker_binary, manager_options);
      !status.ok()) {
    return status;
  }
  // The probe runs the worker the manager's options name, in the devices' threads.
  if (absl::Status status = StartMemoryProbe(options, server.get(), manager_options); !status.ok()) return status;
  // What the manager plans GPU ranks with, read before it recovers and plans any job.
  if (absl::Status status = OpenDeviceCosts(options, server.get(), manager_options); !status.ok()) return status;
  // The manager last of the core parts: it recovers stored jobs with everything above.
  if (absl::Status status = StartJobManager(manager_options, server.get()); !status.ok()) return status;

  // The web server, then gRPC: both read the manager; a failed gRPC bind shuts the web server down.
  if (absl::Status status = StartWebServer(options, server.get()); !status.ok()) return status;
  if (absl::Status status = StartGrpcServer(options, as_owners, *credentials, server.get()); !status.ok()) return status;
  // Last, once both ports listen: whoever reads these files may dial them at once.
  if (absl::Status status = WriteAddressFiles(options, *server); !status.ok()) return status;
  return server;
}

}  // namespace fitrun::server
