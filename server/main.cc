// fitrund: the fitrun coordinator daemon.
//
// Flags are read here and only here, into ServerOptions; BuildAndStart (server/server.h) wires the
// store, the device inventory, the launcher, the job manager, metrics and the gRPC services, and
// returns a running server. SIGTERM or SIGINT shuts it down: workers are stopped, jobs stay stored.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/contract/log.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC address (HOST:PORT; port 0 picks a free one)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "HTTP address of /metrics, the web page (/) and its JSON API (HOST:PORT; port 0 picks one). With "
          "--auth_tokens it takes the same users as --listen. HTTPS with --tls_cert (and client certificates with "
          "--tls_client_ca), as --listen; plain HTTP without, which off loopback needs --insecure");
ABSL_FLAG(std::string, state_dir, "fitrun-state",
          "Directory for the job store, job logs, checkpoints and decoded datasets (datasets/)");
ABSL_FLAG(std::string, devices, "auto",
          "auto (NVML GPUs when the driver's library loads and --worker_cuda, else virtual CPU devices), "
          "virtual CPU devices as cpu:NxSIZE (e.g. cpu:2x4GiB), or GPUs whole or in slices a rank's caching "
          "allocator is capped to: cuda:N, cuda:N@SIZE, cuda:N@SIZExCOUNT, comma-separated (e.g. "
          "cuda:0@2GiB,cuda:1)");
ABSL_FLAG(bool, worker_cuda, false,
          "The fitrun-worker can train on CUDA devices (a CUDA LibTorch build). Debian's LibTorch is CPU-only, so "
          "by default --devices=auto never plans on GPUs, even where NVML sees them");
ABSL_FLAG(bool, memory_probe, true,
          "Calibrate each model's memory estimate by running fitrun-worker --probe once per model (cached in "
          "the state directory); false: analytic estimates only");
ABSL_FLAG(std::string, worker_binary, "", "fitrun-worker to launch (default: the one built beside fitrund)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve the gRPC services and the metrics port over TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA for mutual TLS: a client certificate it signed identifies its holder by its common name");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that --tls_cert chains to, for the ranks to verify fitrund (default: --tls_cert itself, for a "
          "self-signed certificate)");
ABSL_FLAG(bool, insecure, false, "Serve a non-loopback --listen or --metrics_listen address without TLS anyway");
ABSL_FLAG(bool, metrics_public, false,
          "With --auth_tokens or --tls_client_ca: /metrics answers anyone, not only users (Prometheus on a trusted "
          "network without a token); the web page and its API still need a user");
ABSL_FLAG(std::vector<std::string>, metrics_hosts, {},
          "Comma-separated host names the metrics port answers to besides its IP addresses, localhost and the "
          "--metrics_listen host (e.g. a reverse proxy's name); a request for any other Host is refused, so that a "
          "web page cannot reach it by rebinding its own name to this machine");
ABSL_FLAG(std::string, auth_tokens, "",
          "Users: lines of '<user> <admin|user> <sha256 hex of the token> [<unix account>|=]'; reloaded on SIGHUP. "
          "They are the users of the gRPC API, the web page and /metrics alike. Without it and --tls_client_ca every "
          "caller is the local admin. As root, fitrund runs each job as its owner's Unix account (the fourth field; "
          "'=': the account named like the user)");
ABSL_FLAG(std::string, unix_accounts, "listed",
          "Which Unix account a user's jobs run as when fitrund is root and has users: 'listed' (the fourth field "
          "of the user's --auth_tokens line; a user without one cannot submit), 'same_name' (that field, else the "
          "account named like the user) or 'none' (every job runs as fitrund's own user: only where every user may "
          "do what fitrund's user can)");
ABSL_FLAG(int64_t, min_account_uid, 1000,
          "The lowest uid a job's Unix account may have: a user mapped to an account below it (a system account: "
          "www-data, postgres, fitrun itself) cannot submit, whatever --auth_tokens or a certificate says");
ABSL_FLAG(std::string, job_cgroups, "auto",
          "Each attempt's processes in a cgroup of its own, bounded by spec.resources.host_memory and "
          "max_processes and killed whole when the attempt ends: auto (when fitrund is root and the memory and pids "
          "controllers are writable), on (fitrund does not start without them), off");
ABSL_FLAG(std::string, cgroup_parent, "fitrun",
          "Where attempts' cgroups go: relative to fitrund's own cgroup, or absolute from the hierarchy's root "
          "(<parent>/<this fitrund's tag>/<job>-a<attempt>)");
ABSL_FLAG(std::vector<std::string>, data_roots, {},
          "Comma-separated folders that specs may name files in (data, TorchScript, scripts); default: "
          "/usr/share/datasets and <state_dir>/uploads. Never '/': /proc, /sys and /dev are refused anyway");
ABSL_FLAG(std::string, host_memory, "",
          "Host memory the jobs running on this machine may be promised together (the sum of their ranks' "
          "spec.resources.host_memory, or each rank's default), e.g. 48GiB; default: the machine's memory. Plans "
          "take fewer devices, or wait, beyond it (--cluster=local only: Slurm bounds its nodes itself)");
ABSL_FLAG(std::string, max_rank_host_memory, "",
          "The most spec.resources.host_memory one rank may ask for (default: the machine's memory); a spec "
          "asking for more is refused");
ABSL_FLAG(int64_t, max_rank_processes, 0,
          "The most spec.resources.max_processes one rank may ask for (default: a quarter of the machine's task "
          "limit, kernel.threads-max and pid_max, at most 32768); a spec asking for more is refused");
ABSL_FLAG(int, max_jobs_per_user, 10000, "Jobs one user may have queued or running at once");
ABSL_FLAG(int, max_streams_per_user, 1000, "Watch and log streams one user may have open at once");
ABSL_FLAG(int64_t, retain_finished_jobs, 10000,
          "Ended jobs kept, the newest by when they ended; older ones are deleted with their events from the "
          "store (their directories stay). 0: every job is kept");
ABSL_FLAG(int64_t, max_events_per_job, 100000,
          "Events one job stores before its ranks' progress, log and checkpoint reports are no longer kept as "
          "events (its progress still moves; state changes, plans, out-of-memory and final reports are always "
          "kept). 0: no cap");
ABSL_FLAG(std::string, cluster, "local",
          "Where ranks run: local (child processes of fitrund on this machine) or slurm (batch jobs on the Slurm "
          "cluster SLURM_CONF names, planned across its nodes)");
ABSL_FLAG(std::string, slurm_partition, "", "--cluster=slurm: the partition to plan on and submit to (default: every node, the cluster's default partition)");
ABSL_FLAG(std::string, slurm_account, "", "--cluster=slurm: sbatch --account");
ABSL_FLAG(std::string, slurm_sbatch_args, "",
          "--cluster=slurm: more sbatch options, separated by spaces (e.g. '--qos=high --constraint=a100')");
ABSL_FLAG(std::string, slurm_gpu_memory, "",
          "--cluster=slurm: memory of one GPU per Gres type, TYPE=SIZE,... (e.g. a100=80GiB,t4=16GiB; 'gpu' for "
          "untyped Gres)");
ABSL_FLAG(std::string, slurm_virtual_devices, "",
          "--cluster=slurm: virtual CPU devices per node, COUNTxSIZE (e.g. 2x4GiB), for clusters without GPUs");
ABSL_FLAG(std::string, shared_dir, "",
          "--cluster=slurm: a directory every node mounts at the same path, for batch scripts, rank logs, "
          "checkpoints and decoded datasets (and bin/fitrun-worker, when there); without it plans stay on one node");
ABSL_FLAG(std::string, advertise_address, "",
          "Where ranks dial fitrund (HOST or HOST:PORT), when the --listen address is not one they can reach");
ABSL_FLAG(int, warm_ranks, 0,
          "Keep up to this many fitrun-worker processes started and idle, LibTorch loaded, for the next built-in "
          "job of a user whose job just launched (each runs as that user's account and takes only that user's "
          "jobs; they exit with fitrund). 0: every rank starts with its job");
ABSL_FLAG(bool, stop_workers_on_exit, false,
          "Stop running ranks when fitrund exits (default: leave them training; a restarted fitrund re-adopts them)");

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex (gRPC's included) would check lock
  // order on each acquisition, under one process-wide lock: about a sixth of a watcher wake's time
  // (docs/benchmarks.md, "The coordinator"). The unit tests keep the check.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage("fitrund: the fitrun coordinator daemon");
  absl::ParseCommandLine(argc, argv);
  fitrun::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.devices = absl::GetFlag(FLAGS_devices);
  options.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  options.stop_workers_on_exit = absl::GetFlag(FLAGS_stop_workers_on_exit);
  options.worker_cuda = absl::GetFlag(FLAGS_worker_cuda);
  options.memory_probe = absl::GetFlag(FLAGS_memory_probe);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.metrics_public = absl::GetFlag(FLAGS_metrics_public);
  options.metrics_hosts = absl::GetFlag(FLAGS_metrics_hosts);
  options.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  options.unix_accounts = absl::GetFlag(FLAGS_unix_accounts);
  options.min_account_uid = absl::GetFlag(FLAGS_min_account_uid);
  options.job_cgroups = absl::GetFlag(FLAGS_job_cgroups);
  options.cgroup_parent = absl::GetFlag(FLAGS_cgroup_parent);
  options.data_roots = absl::GetFlag(FLAGS_data_roots);
  options.host_memory = absl::GetFlag(FLAGS_host_memory);
  options.max_rank_host_memory = absl::GetFlag(FLAGS_max_rank_host_memory);
  options.max_rank_processes = absl::GetFlag(FLAGS_max_rank_processes);
  options.max_jobs_per_user = absl::GetFlag(FLAGS_max_jobs_per_user);
  options.warm_ranks = absl::GetFlag(FLAGS_warm_ranks);
  options.max_streams_per_user = absl::GetFlag(FLAGS_max_streams_per_user);
  options.retain_finished_jobs = absl::GetFlag(FLAGS_retain_finished_jobs);
  options.max_events_per_job = absl::GetFlag(FLAGS_max_events_per_job);
  options.cluster = absl::GetFlag(FLAGS_cluster);
  options.slurm_partition = absl::GetFlag(FLAGS_slurm_partition);
  options.slurm_account = absl::GetFlag(FLAGS_slurm_account);
  options.slurm_sbatch_args = absl::GetFlag(FLAGS_slurm_sbatch_args);
  options.slurm_gpu_memory = absl::GetFlag(FLAGS_slurm_gpu_memory);
  options.slurm_virtual_devices = absl::GetFlag(FLAGS_slurm_virtual_devices);
  options.shared_dir = absl::GetFlag(FLAGS_shared_dir);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);

  // Signals are taken synchronously by this thread; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGPIPE);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<fitrun::server::RunningServer>> server = fitrun::server::BuildAndStart(options);
  if (!server.ok()) {
    fitrun::contract::LogError("%s", server.status().message());
    return 1;
  }
  const char* web_scheme = options.tls_cert.empty() ? "http" : "https";
  fitrun::contract::LogInfo("serving on %s, metrics on %s://%s/metrics, web page on %s://%s/, state in %s%s",
                            (*server)->address, web_scheme, (*server)->metrics_address, web_scheme,
                            (*server)->metrics_address, options.state_dir,
                            !(*server)->authenticator->secured() ? ""
                            : options.metrics_public ? " (the page and its API for users only; /metrics for anyone)"
                                                     : " (the page, its API and /metrics for users only)");

  int sig = 0;
  while (true) {
    sigwait(&signals, &sig);
    if (sig == SIGPIPE) continue;
    if (sig == SIGHUP) {
      // A new token file takes effect at once (web sessions check their token against it on every
      // request); a broken one leaves the old one in force.
      const absl::Status reloaded = (*server)->authenticator->Reload();
      if (reloaded.ok()) {
        fitrun::contract::LogInfo("SIGHUP: reloaded --auth_tokens");
      } else {
        fitrun::contract::LogError("SIGHUP: %s", reloaded.message());
      }
      continue;
    }
    break;
  }
  fitrun::contract::LogInfo("got %s, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Shutdown(options.stop_workers_on_exit);
  if (!options.stop_workers_on_exit) {
    // Running ranks stay up for the next fitrund to re-adopt; leave without tearing down the
    // objects that watch them. Everything stored is already committed.
    fflush(stderr);
    std::_Exit(0);
  }
  return 0;
}
