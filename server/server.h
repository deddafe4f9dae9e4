// fitrund as a library: Options (what main.cc's flags say) and BuildAndStart, which wires the store,
// the device inventory, the launcher, the memory calibrator, the job manager, metrics and the gRPC
// services into a running server. main.cc only reads flags and waits for a signal; tests can start the
// same server in-process. The model is TensorFlow Serving's model_servers/server.cc.
#ifndef FITRUN_SERVER_SERVER_H_
#define FITRUN_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/auth/authenticator.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/launcher/local_launcher.h"
#include "server/launcher/slurm_launcher.h"
#include "server/metrics/live_metrics.h"
#include "server/metrics/prometheus_metrics.h"
#include "server/probe/process_memory_probe.h"
#include "server/sandbox/job_cgroup.h"
#include "server/service/coordinator_service.h"
#include "server/service/worker_channel_service.h"
#include "server/store/sqlite_job_store.h"
#include "server/web/web_server.h"

namespace fitrun::server {

// fitrun_build_info's version label: the API fitrund serves.
inline constexpr char kFitrundVersion[] = "v1";

// fitrund's flags, as main.cc binds them (see its flag definitions for each one's meaning).
struct ServerOptions {
  std::string listen = "127.0.0.1:7070";
  std::string metrics_listen = "127.0.0.1:9464";
  std::string state_dir = "fitrun-state";
  std::string devices = "auto";
  std::string worker_binary;  // empty: the one built beside fitrund
  bool worker_cuda = false;
  bool memory_probe = true;
  bool stop_workers_on_exit = false;
  // TLS for both services: the server's certificate chain and key (PEM files); tls_client_ca makes it
  // mutual (a client certificate it signed identifies its holder); tls_ca is the CA tls_cert chains
  // to, handed to the ranks to verify fitrund (empty: tls_cert itself, for a self-signed one).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string tls_ca;
  // Serve a non-loopback address (--listen or --metrics_listen) without TLS anyway.
  bool insecure = false;
  // Secured: /metrics answers anyone, not only users (Prometheus on a trusted network without a
  // token); the page and its API still need a user.
  bool metrics_public = false;
  // Names the metrics port answers to besides its addresses, localhost and its listen host (a
  // reverse proxy's): a request for any other Host is refused (DNS rebinding).
  std::vector<std::string> metrics_hosts;
  // Users' bearer tokens (server/auth/authenticator.h); with tls_client_ca, certificates too.
  std::string auth_tokens;
  // "listed" or "same_name": the Unix account of a user the tokens file gives none; "none": jobs
  // run as fitrund's own user even as root (every user trusted with it). See RunsJobsAsOwners.
  std::string unix_accounts = "listed";
  // The lowest uid a job's account may have: system accounts below never run a user's job.
  int64_t min_account_uid = 1000;
  // "auto", "on" or "off": each attempt's processes in a cgroup of their own (--job_cgroups), made
  // under cgroup_parent (relative to fitrund's own cgroup, or absolute).
  std::string job_cgroups = "auto";
  std::string cgroup_parent = "fitrun";
  // The folders specs may name files in (server/core/specs/data_roots.h). Empty: Debian's datasets
  // (/usr/share/datasets) and <state_dir>/uploads.
  std::vector<std::string> data_roots;
  // The host memory this machine's running jobs may be promised together, and the most one rank
  // may ask for (sizes such as 48GiB; empty: the machine's memory); the most tasks one rank may ask
  // for (0: a quarter of the machine's task limit, at most 32768).
  std::string host_memory;
  std::string max_rank_host_memory;
  int64_t max_rank_processes = 0;
  // Per user: jobs queued or running at once, and watch and log streams open at once.
  int max_jobs_per_user = 10000;
  // Idle warm ranks fitrund keeps at most (server/launcher/warm_ranks.h); 0: none.
  int warm_ranks = 0;
  int max_streams_per_user = 1000;
  // Retention: ended jobs kept (0: all), and events one job stores before its ranks' chatter is no
  // longer kept (0: no cap). See server/core/jobs/retention.h and report_ingest.h.
  int64_t retain_finished_jobs = 10000;
  int64_t max_events_per_job = 100000;
  // Where ranks run: "local" (this machine) or "slurm" (a Slurm cluster, the one SLURM_CONF names).
  std::string cluster = "local";
  // On Slurm: sbatch's --partition and --account, more sbatch arguments (split at whitespace), GPU
  // memory per Gres type ("a100=80GiB,..."), virtual CPU devices per node ("2x4GiB") for clusters
  // without GPUs.
  std::string slurm_partition;
  std::string slurm_account;
  std::string slurm_sbatch_args;
  std::string slurm_gpu_memory;
  std::string slurm_virtual_devices;
  // A directory every node sees at the same path: jobs' batch scripts, rank logs and checkpoints go
  // under it (<shared_dir>/jobs), as does the ranks' decoded-dataset cache (<shared_dir>/datasets,
  // otherwise <state_dir>/datasets), and a fitrun-worker in <shared_dir>/bin is the one ranks run.
  // Without it, plans stay on one node.
  std::string shared_dir;
  // Where ranks dial fitrund's WorkerChannel (HOST or HOST:PORT; empty: the --listen address).
  std::string advertise_address;
};

// Everything a running coordinator owns, torn down in dependency order. Owned by the thread that
// started it.
struct RunningServer {
  // The state directory's lock (flock on <state_dir>/fitrund.lock), held for the process's life: the
  // kernel releases it when the process dies, however it dies.
  int state_lock_fd = -1;
  std::unique_ptr<SqliteJobStore> store;
  std::unique_ptr<DeviceInventory> devices;
  // Attempts' and probes' cgroups (--job_cgroups); null when off. Outlives the launcher and the probe.
  std::unique_ptr<JobCgroups> cgroups;
  std::unique_ptr<WorkerLauncher> launcher;
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<PrometheusMetrics> metrics;
  // After the metrics they report to, before the manager, so they outlive it.
  std::unique_ptr<ProcessMemoryProbe> memory_probe;
  std::unique_ptr<MemoryCalibrator> memory_calibrator;
  std::unique_ptr<DeviceCostsBook> device_costs;
  std::unique_ptr<Authenticator> authenticator;
  std::unique_ptr<JobManager> manager;
  // /metrics, the web page and its API; reads the manager, so it goes first.
  std::unique_ptr<WebServer> web;
  std::unique_ptr<CoordinatorService> coordinator_service;
  std::unique_ptr<WorkerChannelService> worker_service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::string address;
  std::string metrics_address;

  // Stops serving. With stop_workers, ranks are stopped and waited for; without, they keep
  // training and the process must end without destroying the launcher (whose threads wait on them).
  void Shutdown(bool stop_workers);
};

// Builds every part from `options` and starts serving; the chosen addresses are also written to
// <state_dir>/fitrund.address and fitrund.metrics_address. Errors name the flag; a state directory
// another fitrund holds is FAILED_PRECONDITION naming that fitrund's pid (two coordinators over one
// store would both recover, launch and re-adopt the same jobs).
// Whether every job runs as its owner's Unix account: fitrund has users (tokens or client
// certificates), is root, and --unix_accounts is not none. Then a user without an account cannot submit, job directories are
// their owners' (0700) and the state directory is fitrund's (0711, its files 0600).
bool RunsJobsAsOwners(const ServerOptions& options);

absl::StatusOr<std::unique_ptr<RunningServer>> BuildAndStart(const ServerOptions& options);

// BuildAndStart's steps that derive something from the flags alone, here so that server_test.cc
// checks them without starting a server.
namespace startup {

// --listen as gRPC will bind it: a port 0 already replaced by a free one, since ranks are told the
// address before the gRPC server exists.
struct ListenAddress {
  std::string host;       // as given ("0.0.0.0", "[::1]", "")
  std::string port;       // never "0"
  std::string dial_host;  // where a local rank dials: host, or 127.0.0.1 for a wildcard host
  std::string address() const { return host + ":" + port; }
};
absl::StatusOr<ListenAddress> ResolveListen(const std::string& listen);

// Where ranks dial fitrund's WorkerChannel: --advertise_address (HOST, or HOST:PORT; a bare
// "[v6]" gets the listen port), else the listen address as a local rank dials it.
std::string WorkerChannelAddress(const std::string& advertise_address, const ListenAddress& listen);

// --max_jobs_per_user, --retain_finished_jobs, --max_events_per_job and --min_account_uid into the
// manager's options, or the first one out of range, named.
absl::Status SetJobLimits(const ServerOptions& options, JobManager::Options& manager);

}  // namespace startup

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVER_H_
