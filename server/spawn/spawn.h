// How fitrund starts a process. Ranks (server/launcher), memory probes (server/probe) and Slurm's
// client commands (server/slurm) all start here, so what a child inherits from the coordinator (its
// signal mask and dispositions, its environment, its file descriptors, its process group) is decided
// in one place.
//
// Thread-safety: every function may be called from any thread.
#ifndef FITRUN_SERVER_SPAWN_SPAWN_H_
#define FITRUN_SERVER_SPAWN_SPAWN_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/sandbox/unix_account.h"

namespace fitrun::server {

struct SpawnOptions {
  // argv[0] is the program's path (no PATH lookup, no shell).
  std::vector<std::string> argv;
  // The child gets fitrund's environment (PATH, library and BLAS settings) with these set on top.
  std::vector<std::pair<std::string, std::string>> env;
  // Where it starts; empty: fitrund's working directory.
  std::string working_dir;
  // Its standard input: this descriptor, or /dev/null when -1 (a child never reads fitrund's).
  int stdin_fd = -1;
  // Its standard output and error: a file both are appended to (created 0644), or these
  // descriptors, or fitrund's own when neither is set.
  std::string output_path;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // A process group of its own: stopping the group then stops whatever the child started, and a
  // terminal's signals meant for fitrund do not reach it.
  bool own_process_group = true;
  // When set (fitrund is root), the child runs as this account: its uid, gid and supplementary
  // groups, in a session of its own, unable to gain privileges (no_new_privs), with no descriptor of
  // fitrund's beyond its standard streams, and a clean environment: `env` on top of PATH, HOME,
  // USER, LOGNAME, SHELL and fitrund's locale, time zone, library path and GPU selection, never
  // fitrund's own variables. Its output file is opened as the account, in a directory it may write.
  std::optional<UnixAccount> run_as;
  // The cgroup.procs files of the cgroups the child joins (it writes 0 to each) before it execs, so
  // nothing it starts escapes them.
  std::vector<std::string> cgroup_procs_files;
  // A descriptor the child gets as descriptor `secret_target` (kept across the exec): the read end
  // of a pipe holding a secret only that process may read (a rank's job token). -1: none.
  int secret_fd = -1;
  int secret_target = 3;
  // A rank's limits instead of fitrund's (which may be root's): no core dumps (a dump would hold the
  // job token and the rank's data) and kRankOpenFiles descriptors, as a login session has.
  bool rank_limits = false;
  // How long a child run as an account or in cgroups may take to reach its exec before it is killed
  // and Spawn fails (its steps before the exec touch what the account controls; see ForkExec).
  absl::Duration exec_deadline = absl::Seconds(10);
};

// Open files a rank may have (RLIMIT_NOFILE, soft and hard, at most fitrund's own hard limit):
// systemd's hard limit for a login session, enough for data loaders and collectives.
inline constexpr int kRankOpenFiles = 524288;

// Starts the child. Descriptors fitrund opened close-on-exec (all of its own) stay out of it;
// the signals fitrund takes synchronously (it blocks them on every thread) are unblocked and back to
// their defaults in it. INTERNAL naming argv[0] and the reason when it cannot start (for a child
// run as an account or in cgroups: the step that failed in the child, such as joining a cgroup or
// opening its output file as the account).
absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

// A pipe whose ends are both close-on-exec: Spawn dup2s the child's end into place.
struct Pipe {
  int read_end = -1;
  int write_end = -1;
};
absl::StatusOr<Pipe> MakePipe();
// Closes *fd if open and marks it closed.
void CloseFd(int* fd);
// Writes all of `bytes` to the write end of a pipe whose reader is a process of an account's: that
// account may have stopped it, or reopened the pipe through /proc and filled it. Makes `fd`
// non-blocking and gives up after `deadline`: DEADLINE_EXCEEDED then, UNAVAILABLE when the reader is
// gone (EPIPE: the caller decides what a SIGPIPE does; fitrund blocks it on every thread).
absl::Status WriteToPipeWithin(int fd, std::string_view bytes, absl::Duration deadline);

// How a child ended: its exit code, or the signal that killed it (exit_code -1 then).
struct ChildExit {
  int exit_code = 0;
  int signal = 0;
  // "exited with 3" or "was killed by signal 9".
  std::string Describe() const;
};
ChildExit ChildExitFromWaitStatus(int status);
// Waits for the child to end and reaps it (retrying on EINTR).
ChildExit Reap(pid_t pid);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SPAWN_SPAWN_H_
