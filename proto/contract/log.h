// fitrund's and its processes' diagnostics on standard error, one line per message:
//
//   W 2025-01-02T03:04:05.678Z fitrund: slurm inventory: scontrol timed out; keeping the last list
//
// the severity's letter (I, W, E), the time in UTC to the millisecond, the program's name, then the
// text. A line is written with one write(2), so lines from threads do not interleave; newlines in the
// text become " | ", so a message quoting a job's output cannot pass for lines of the program's own.
// Thread-safe; not async-signal-safe (it allocates): a signal handler or a child between fork and exec
// writes with write(2) itself. Diagnostics only: what a program prints for its user on purpose (a
// usage text, a benchmark's table) stays plain output.
//
// No FATAL: a program that gives up logs an error and exits with its own documented code.
#ifndef FITRUN_PROTO_CONTRACT_LOG_H_
#define FITRUN_PROTO_CONTRACT_LOG_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace fitrun::contract {

enum class LogSeverity {
  kInfo,     // a start-up fact, a state reached: "serving on ...", "connected to ..."
  kWarning,  // a fallback taken or a retry coming: the program goes on, maybe with less
  kError,    // a refusal, lost data, or a program giving up
};

// Writes one line to the log's file descriptor (standard error unless SetLogFd said otherwise).
void Log(LogSeverity severity, absl::string_view text);

// The same with the text formatted by absl::StrFormat: LogWarning("squeue: %s; retrying", why).
template <typename... Args>
void LogInfo(const absl::FormatSpec<Args...>& format, const Args&... args) {
  Log(LogSeverity::kInfo, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogWarning(const absl::FormatSpec<Args...>& format, const Args&... args) {
  Log(LogSeverity::kWarning, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  Log(LogSeverity::kError, absl::StrFormat(format, args...));
}

// The line Log writes for `text` at `time`, newline included.
std::string FormatLogLine(LogSeverity severity, absl::Time time, absl::string_view program, absl::string_view text);

// The name each line carries: the executable's file name (program_invocation_short_name) until set,
// e.g. by a test that stands in for fitrund.
void SetLogProgramName(absl::string_view name);

// Where lines go from now on (2 by default); returns the descriptor used before. For tests.
int SetLogFd(int fd);

}  // namespace fitrun::contract

#endif  // FITRUN_PROTO_CONTRACT_LOG_H_
