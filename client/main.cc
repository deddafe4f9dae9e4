// fitrun: the command-line client of the fitrun coordinator (fitrund). The command line is parsed
// from the table in cli.cc; this file connects to the coordinator and runs the chosen command.
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/grpc_coordinator_client.h"

namespace fitrun::client {
namespace {

// Set by SIGINT and SIGTERM while top runs, so it can restore the cursor and exit 0.
volatile std::sig_atomic_t g_interrupted = 0;

void OnInterrupt(int) { g_interrupted = 1; }

// Only a command that runs until interrupted (top) installs it: every other command keeps the
// default, where Ctrl-C ends the process.
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

int Main(int argc, char** argv) {
  const ParsedCommandLine parsed = ParseCommandLine(argc, argv, std::cout, std::cerr);
  if (parsed.command == nullptr) return parsed.exit_code;
  const CliOptions& options = parsed.options;

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
  if (parsed.command->runs_until_interrupted) CatchInterrupts();
  return parsed.command->run(env, options);
}

}  // namespace
}  // namespace fitrun::client

int main(int argc, char** argv) { return fitrun::client::Main(argc, argv); }
