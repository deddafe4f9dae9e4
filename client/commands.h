// The CLI's commands as plain functions: each calls the coordinator, renders, prints and returns
// the process exit code. main.cc only parses flags and picks one.
#ifndef FITRUN_CLIENT_COMMANDS_H_
#define FITRUN_CLIENT_COMMANDS_H_

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_api.h"

namespace fitrun::client {

// Exit codes are part of the CLI's contract with scripts.
enum ExitCode : int {
  kExitOk = 0,
  // `watch` (and `submit --watch`): the job ended FAILED.
  kExitJobFailed = 1,
  // `watch`: the job ended CANCELLED.
  kExitJobCancelled = 2,
  // The coordinator could not be reached, or the connection broke (UNAVAILABLE, DEADLINE_EXCEEDED),
  // or a watch stream ended before the job did.
  kExitTransport = 3,
  // The coordinator refused the request (INVALID_ARGUMENT, NOT_FOUND, ...).
  kExitRejected = 4,
  // Nothing was sent: a spec file could not be read, or the reply could not be printed.
  kExitLocalError = 5,
  // The command line itself was wrong (CLI11's parse errors).
  kExitUsage = 64,
};

// A terminal's size in character cells; 0 when unknown (not a terminal).
struct TerminalSize {
  int columns = 0;
  int rows = 0;
};

// Everything a command touches outside itself, so tests run commands against FakeCoordinator and
// read back what they printed.
struct CommandEnv {
  CoordinatorApi* coordinator = nullptr;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  // stdout is a terminal: watch redraws its progress line in place instead of logging it.
  bool out_is_terminal = false;
  // The local clock: ages in tables and the pace of watch's output.
  std::function<absl::Time()> now = absl::Now;
  absl::TimeZone zone = absl::UTCTimeZone();
  // How watch waits between reconnection attempts, and for how long it keeps trying after the
  // coordinator went away (a restarting coordinator is back within seconds).
  std::function<void(absl::Duration)> sleep = [](absl::Duration d) { absl::SleepFor(d); };
  absl::Duration reconnect_for = absl::Minutes(2);
  // stdout's terminal size now: it may change between two refreshes of top.
  std::function<TerminalSize()> terminal_size = [] { return TerminalSize{}; };
  // The user asked to stop (Ctrl-C): a command that runs until then (top) checks it between waits.
  std::function<bool()> interrupted = [] { return false; };
};

struct TopOptions {
  // Between two refreshes of the live table.
  absl::Duration interval = absl::Seconds(2);
  // One plain print even on a terminal (a pipe always gets exactly one).
  bool once = false;
};

int RunSubmit(const CommandEnv& env, const std::string& spec_path, bool watch);
int RunWatch(const CommandEnv& env, const std::string& job_id);
int RunGet(const CommandEnv& env, const std::string& job_id, bool json);
// Prints the job's stored events so far, one JSON object per line (the JobEvent's JSON mapping, with
// its time): what a script reads of a job's history.
int RunEvents(const CommandEnv& env, const std::string& job_id);
// `states`: only jobs in these states (names as printed, case-insensitive: running, queued, ...).
int RunList(const CommandEnv& env, bool json, const std::vector<std::string>& states = {});
// Prints a rank's log; with follow, keeps printing until the attempt ends.
int RunLogs(const CommandEnv& env, const std::string& job_id, int rank, bool follow);
int RunCancel(const CommandEnv& env, const std::string& job_id, const std::string& reason);
int RunPlan(const CommandEnv& env, const std::string& spec_path, bool json);
int RunDevices(const CommandEnv& env, bool json);
// The devices and unfinished jobs as a table redrawn in place every interval until interrupted;
// printed once, plainly, when stdout is not a terminal or with `once`.
int RunTop(const CommandEnv& env, const TopOptions& options);

// The whole file; errors name the path and the system's reason.
absl::StatusOr<std::string> ReadSpecFile(const std::string& path);

// Transport failures (the coordinator unreachable, the connection lost) get kExitTransport so a
// script can tell "retry later" from "fix the request" (kExitRejected).
int ExitCodeForRpcError(const absl::Status& status);
bool IsTransportError(const absl::Status& status);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_COMMANDS_H_
