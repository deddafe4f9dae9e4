// The CLI's command line: its subcommands declared once, in one table (name, one-line help,
// arguments, handler), from which the parser, the usage and --help text and the dispatch are all
// made. The commands themselves stay plain functions in commands.h; a handler only passes the
// parsed options to one of them.
#ifndef FITRUN_CLIENT_CLI_H_
#define FITRUN_CLIENT_CLI_H_

#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "client/commands.h"

namespace fitrun::client {

// Every flag and argument of one invocation; filled by the parser, read by the handlers.
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

// One argument of a subcommand and the CliOptions member it fills. A name starting with '-' is an
// option ("--rank", or "--follow,-f" with a short form), a flag when its member is a bool; any other
// name is a required positional argument.
struct CliArg {
  using Target = std::variant<std::string CliOptions::*, bool CliOptions::*, int CliOptions::*,
                              double CliOptions::*, std::vector<std::string> CliOptions::*>;
  const char* name;
  const char* help;
  Target target;
  // --help shows the member's default value.
  bool show_default = false;
  // Only a number > 0 is accepted.
  bool positive = false;
};

struct Subcommand {
  const char* name;
  // One line, in `fitrun --help` and at the top of `fitrun NAME --help`.
  const char* help;
  std::vector<CliArg> args;
  // Runs the command with the parsed options; returns the process's exit code.
  int (*run)(const CommandEnv& env, const CliOptions& options);
  // It runs until the user stops it: Ctrl-C and SIGTERM are caught (env.interrupted) so it can end
  // cleanly, where every other command keeps the default, which ends the process.
  bool runs_until_interrupted = false;
};

// The table, in the order `fitrun --help` lists the subcommands.
const std::vector<Subcommand>& Subcommands();

struct ParsedCommandLine {
  // What to run; null when nothing is (--help, --version, a usage error): then exit with exit_code.
  const Subcommand* command = nullptr;
  CliOptions options;
  int exit_code = kExitOk;
};

// Parses argv with the global flags and the table's subcommands. Help and version text go to out,
// usage errors to err.
ParsedCommandLine ParseCommandLine(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_CLI_H_
