#include "proto/contract/log.h"

#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"

namespace fitrun::contract {
namespace {

std::atomic<int> g_fd{STDERR_FILENO};

absl::Mutex g_program_mu(absl::kConstInit);
// Set at most a few times (at start, by tests); nullptr means the executable's own name.
std::string* g_program ABSL_GUARDED_BY(g_program_mu) = nullptr;

char SeverityLetter(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
  }
  return '?';
}

std::string ProgramName() {
  absl::MutexLock lock(&g_program_mu);
  if (g_program != nullptr) return *g_program;
  return program_invocation_short_name;
}

}  // namespace

std::string FormatLogLine(LogSeverity severity, absl::Time time, absl::string_view program, absl::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  return absl::StrCat(std::string(1, SeverityLetter(severity)), " ",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()), " ", program, ": ",
                      absl::StrReplaceAll(text, {{"\n", " | "}}), "\n");
}

void Log(LogSeverity severity, absl::string_view text) {
  const std::string line = FormatLogLine(severity, absl::Now(), ProgramName(), text);
  const int fd = g_fd.load(std::memory_order_relaxed);
  // One write for the whole line (a pipe takes up to PIPE_BUF bytes whole); the loop only finishes a
  // write cut short, e.g. of a line longer than that.
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere left to say it
    written += static_cast<size_t>(n);
  }
}

void SetLogProgramName(absl::string_view name) {
  absl::MutexLock lock(&g_program_mu);
  delete g_program;
  g_program = new std::string(name);
}

int SetLogFd(int fd) { return g_fd.exchange(fd); }

}  // namespace fitrun::contract
