// fitrun: the command-line client of the fitrun coordinator (fitrund).
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/grpc_coordinator_client.h"

namespace fitrun::client {
namespace {

// Set by SIGINT and SIGTERM while top runs, so it can restore the cursor and exit 0.
volatile std::sig_atomic_t g_interrupted = 0;

void OnInterrupt(int) { g_interrupted = 1; }

// Only top installs it: every other command keeps the default, where Ctrl-C ends the process.
void CatchInterrupts() {
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

TerminalSize StdoutTerminalSize() {
  struct winsize size = {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) != 0) return {};
  return {size.ws_col, size.ws_row};
}

// Every flag and argument of one invocation; filled by CLI11, read by Run.
struct CliOptions {
  std::string coordinator = "127.0.0.1:7070";
  // TLS (a CA to verify fitrund; a client certificate and key for mutual TLS) and a bearer token.
  std::string ca;
  std::string cert;
  std::string key;
  std::string token;
  std::string spec_path;
  std::string job_id;
  std::string cancel_reason = "cancelled with fitrun cancel";
  bool watch = false;
  bool json = false;
  std::vector<std::string> states;
  int rank = 0;
  bool follow = false;
  double interval_seconds = 2;
  bool once = false;
};

enum class Command { kSubmit, kWatch, kGet, kList, kLogs, kCancel, kPlan, kDevices, kTop };

int Run(Command command, const CliOptions& options) {
  GrpcCoordinatorClient::Options client_options;
  client_options.address = options.coordinator;
  client_options.ca_file = options.ca;
  client_options.cert_file = options.cert;
  client_options.key_file = options.key;
  client_options.token = options.token;
  absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> client =
      GrpcCoordinatorClient::Create(client_options);
  if (!client.ok()) {
    std::cerr << "error: " << client.status().message() << std::endl;
    return kExitUsage;
  }

  CommandEnv env;
  env.coordinator = client->get();
  env.out = &std::cout;
  env.err = &std::cerr;
  // A dumb terminal (Emacs shell buffers, some CI consoles) shows escape codes as garbage.
  const char* term = std::getenv("TERM");
  env.out_is_terminal =
      isatty(STDOUT_FILENO) == 1 && !(term != nullptr && std::string(term) == "dumb");
  env.now = absl::Now;
  env.zone = absl::LocalTimeZone();
  env.terminal_size = StdoutTerminalSize;
  env.interrupted = [] { return g_interrupted != 0; };

  switch (command) {
    case Command::kSubmit:
      return RunSubmit(env, options.spec_path, options.watch);
    case Command::kWatch:
      return RunWatch(env, options.job_id);
    case Command::kGet:
      return RunGet(env, options.job_id, options.json);
    case Command::kList:
      return RunList(env, options.json, options.states);
    case Command::kLogs:
      return RunLogs(env, options.job_id, options.rank, options.follow);
    case Command::kCancel:
      return RunCancel(env, options.job_id, options.cancel_reason);
    case Command::kPlan:
      return RunPlan(env, options.spec_path, options.json);
    case Command::kDevices:
      return RunDevices(env, options.json);
    case Command::kTop: {
      CatchInterrupts();
      TopOptions top;
      top.interval = absl::Seconds(options.interval_seconds);
      top.once = options.once;
      return RunTop(env, top);
    }
  }
  return kExitUsage;
}

int Main(int argc, char** argv) {
  CliOptions options;
  CLI::App app{"fitrun: submit, plan, watch and manage training jobs on a fitrun coordinator."};
  app.set_version_flag("--version", "fitrun v1");
  app.require_subcommand(1);
  // Global flags are accepted after the command too: `fitrun list --coordinator=host:7070`.
  app.fallthrough();
  app.add_option("--coordinator", options.coordinator, "the coordinator's HOST:PORT")
      ->envname("FITRUN_COORDINATOR")
      ->capture_default_str();
  app.add_option("--ca", options.ca, "PEM CA that fitrund's certificate chains to: connect with TLS")
      ->envname("FITRUN_CA");
  app.add_option("--cert", options.cert, "PEM client certificate, for a fitrund with mutual TLS")
      ->envname("FITRUN_CERT");
  app.add_option("--key", options.key, "PEM key of --cert")->envname("FITRUN_KEY");
  app.add_option("--token", options.token, "bearer token, for a fitrund with users")->envname("FITRUN_TOKEN");
  app.footer(
      "Exit codes: 0 ok; 1 job FAILED; 2 job CANCELLED; 3 coordinator unreachable or stream "
      "lost; 4 request refused by the coordinator; 5 local error (unreadable spec file); "
      "64 usage.");

  auto add_json = [&](CLI::App* command) {
    command->add_flag("--json", options.json, "print the reply as the proto's JSON mapping");
  };

  CLI::App* submit = app.add_subcommand("submit", "submit a job spec (YAML) and print its id");
  submit->add_option("spec", options.spec_path, "job spec YAML file")->required();
  submit->add_flag("--watch", options.watch, "then follow the job as `fitrun watch` does");

  CLI::App* watch =
      app.add_subcommand("watch", "follow a job's events and progress until it ends");
  watch->add_option("id", options.job_id, "job id")->required();

  CLI::App* get = app.add_subcommand("get", "show one job");
  get->add_option("id", options.job_id, "job id")->required();
  add_json(get);

  CLI::App* list = app.add_subcommand("list", "list jobs");
  list->add_option("--state", options.states, "only jobs in this state (repeatable): queued, running, failed, ...");
  add_json(list);

  CLI::App* logs = app.add_subcommand("logs", "print a rank's log (stdout and stderr) of the job's latest attempt");
  logs->add_option("id", options.job_id, "job id")->required();
  logs->add_option("--rank", options.rank, "which rank")->capture_default_str();
  logs->add_flag("--follow,-f", options.follow, "keep printing until the attempt ends");

  CLI::App* cancel = app.add_subcommand("cancel", "stop every rank of a job");
  cancel->add_option("id", options.job_id, "job id")->required();
  cancel->add_option("--reason", options.cancel_reason, "recorded with the cancellation")
      ->capture_default_str();

  CLI::App* plan =
      app.add_subcommand("plan", "show the plan a spec would get now, without running it");
  plan->add_option("spec", options.spec_path, "job spec YAML file")->required();
  add_json(plan);

  CLI::App* devices = app.add_subcommand("devices", "list the coordinator's devices");
  add_json(devices);

  CLI::App* top = app.add_subcommand(
      "top", "devices and unfinished jobs, refreshed in place until Ctrl-C (printed once into a pipe)");
  top->add_option("--interval", options.interval_seconds, "seconds between refreshes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  top->add_flag("--once", options.once, "print the table once, plain, and exit");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }

  Command command = Command::kDevices;
  if (*submit) command = Command::kSubmit;
  else if (*watch) command = Command::kWatch;
  else if (*get) command = Command::kGet;
  else if (*list) command = Command::kList;
  else if (*logs) command = Command::kLogs;
  else if (*cancel) command = Command::kCancel;
  else if (*plan) command = Command::kPlan;
  else if (*top) command = Command::kTop;
  return Run(command, options);
}

}  // namespace
}  // namespace fitrun::client

int main(int argc, char** argv) { return fitrun::client::Main(argc, argv); }
