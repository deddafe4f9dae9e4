#include "server/slurm/slurm_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "proto/contract/find_command.h"
#include "server/spawn/spawn.h"

namespace fitrun::server::slurm {
namespace {

// Past this, only the end of a command's stderr is kept: its last lines say what went wrong.
constexpr size_t kStderrLimit = 64 << 10;
// The most of a command's output an error message quotes.
constexpr size_t kMessageLimit = 2000;

// `scontrol show node --oneliner`, quoting arguments with spaces, for messages.
std::string CommandLine(const std::vector<std::string>& argv) {
  return absl::StrJoin(argv, " ", [](std::string* out, const std::string& arg) {
    const bool quote = arg.empty() || arg.find_first_of(" \t'\"") != std::string::npos;
    absl::StrAppend(out, quote ? absl::StrCat("'", arg, "'") : arg);
  });
}

std::string Trimmed(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.size() <= kMessageLimit) return std::string(text);
  return absl::StrCat("...", text.substr(text.size() - kMessageLimit));
}

// Debian puts the clients in /usr/bin, which a service's PATH may leave out.
absl::StatusOr<std::string> FindSlurmProgram(const std::string& name) {
  absl::StatusOr<std::string> path = fitrun::contract::launch::FindCommand(name, "");
  if (path.ok() || name.find('/') != std::string::npos) return path;
  absl::StatusOr<std::string> in_usr_bin = fitrun::contract::launch::FindCommand("/usr/bin/" + name, "");
  if (in_usr_bin.ok()) return in_usr_bin;
  const char* path_env = std::getenv("PATH");
  return absl::NotFoundError(absl::StrCat(
      name, ": not found on PATH (", path_env != nullptr ? path_env : "", ") nor in /usr/bin; fitrund's Slurm mode "
      "needs slurm-wlm's client tools (scontrol, sbatch, squeue, scancel; Debian: apt-get install slurm-client)"));
}

}  // namespace

absl::StatusOr<std::string> RunSlurmCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("RunSlurmCommand: argv is empty");
  const std::string command = CommandLine(argv);
  absl::StatusOr<std::string> program = FindSlurmProgram(argv[0]);
  if (!program.ok()) return program.status();

  absl::StatusOr<Pipe> out_pipe = MakePipe();
  if (!out_pipe.ok()) return out_pipe.status();
  absl::StatusOr<Pipe> err_pipe = MakePipe();
  if (!err_pipe.ok()) {
    CloseFd(&out_pipe->read_end);
    CloseFd(&out_pipe->write_end);
    return err_pipe.status();
  }
  SpawnOptions spawn;
  spawn.argv = argv;
  spawn.argv[0] = *program;
  spawn.stdout_fd = out_pipe->write_end;
  spawn.stderr_fd = err_pipe->write_end;
  // A group of its own, so a timeout's kill reaches anything it started, and no terminal signal
  // meant for fitrund reaches it.
  spawn.own_process_group = true;
  absl::StatusOr<pid_t> spawned = Spawn(spawn);
  CloseFd(&out_pipe->write_end);
  CloseFd(&err_pipe->write_end);
  if (!spawned.ok()) {
    CloseFd(&out_pipe->read_end);
    CloseFd(&err_pipe->read_end);
    return absl::InternalError(absl::StrCat("`", command, "`: ", spawned.status().message()));
  }
  const pid_t pid = *spawned;

  // Read both pipes until they close and the child has exited, or until the deadline. A pidfd says
  // when it exits; without one (kernels before 5.3) the loop looks every 20 ms.
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  int fds[2] = {out_pipe->read_end, err_pipe->read_end};
  std::string output[2];
  bool exited = false;
  bool timed_out = false;
  int poll_error = 0;
  const absl::Time deadline = absl::Now() + timeout;
  while (fds[0] >= 0 || fds[1] >= 0 || !exited) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    pollfd polled[3];
    int count = 0;
    for (int fd : fds) {
      if (fd >= 0) polled[count++] = {fd, POLLIN, 0};
    }
    const bool poll_pidfd = !exited && pidfd >= 0;
    if (poll_pidfd) polled[count++] = {pidfd, POLLIN, 0};
    int wait_ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
                                                     60 * 60 * 1000));
    if (!exited && pidfd < 0) wait_ms = std::min(wait_ms, 20);
    if (poll(polled, static_cast<nfds_t>(count), wait_ms) < 0) {
      if (errno == EINTR) continue;
      poll_error = errno;  // Cannot wait for it any more: end it.
      break;
    }
    for (int i = 0; i < count; ++i) {
      if (polled[i].fd == pidfd || polled[i].revents == 0) continue;
      const int which = polled[i].fd == fds[0] ? 0 : 1;
      char buffer[16384];
      const ssize_t n = read(fds[which], buffer, sizeof(buffer));
      if (n > 0) {
        output[which].append(buffer, static_cast<size_t>(n));
        if (which == 1 && output[1].size() > kStderrLimit) output[1].erase(0, output[1].size() - kStderrLimit / 2);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        CloseFd(&fds[which]);
      }
    }
    if (poll_pidfd) {
      exited = (polled[count - 1].revents & POLLIN) != 0;
    } else if (!exited) {
      siginfo_t info{};
      exited = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
    }
  }
  // The child is not reaped yet, so neither its pid nor its group id can have been reused.
  if (timed_out || poll_error != 0) kill(-pid, SIGKILL);
  CloseFd(&fds[0]);
  CloseFd(&fds[1]);
  CloseFd(&pidfd);
  const ChildExit exit = Reap(pid);

  const std::string& said = absl::StripAsciiWhitespace(output[1]).empty() ? output[0] : output[1];
  const std::string detail = Trimmed(said).empty() ? "" : absl::StrCat(": ", Trimmed(said));
  if (poll_error != 0) {
    return absl::InternalError(absl::StrCat("waiting for `", command, "`: poll: ", std::strerror(poll_error)));
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("`", command, "` did not finish within ", absl::FormatDuration(timeout), "; killed it", detail));
  }
  if (exit.signal != 0) {
    return absl::UnavailableError(absl::StrCat("`", command, "` was killed by signal ", exit.signal, detail));
  }
  if (exit.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("`", command, "` exited with status ", exit.exit_code,
                                               detail.empty() ? " and said nothing" : detail));
  }
  return std::move(output[0]);
}

SlurmRunner RealSlurmRunner(absl::Duration timeout) {
  return [timeout](const std::vector<std::string>& argv) { return RunSlurmCommand(argv, timeout); };
}

}  // namespace fitrun::server::slurm
