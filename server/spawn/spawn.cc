#include "server/spawn/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <grp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace fitrun::server {
namespace {

// posix_spawn's attributes: an empty signal mask and default handling of the signals fitrund takes
// over, whatever the coordinator's threads have blocked; a process group of its own on request.
class SpawnAttributes {
 public:
  explicit SpawnAttributes(bool own_process_group) {
    posix_spawnattr_init(&attr_);
    sigset_t empty, defaults;
    sigemptyset(&empty);
    sigemptyset(&defaults);
    for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP, SIGCHLD}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr_, &empty);
    posix_spawnattr_setsigdefault(&attr_, &defaults);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (own_process_group) {
      posix_spawnattr_setpgroup(&attr_, 0);
      flags |= POSIX_SPAWN_SETPGROUP;
    }
    posix_spawnattr_setflags(&attr_, flags);
  }
  ~SpawnAttributes() { posix_spawnattr_destroy(&attr_); }
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;

  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

class FileActions {
 public:
  FileActions() { posix_spawn_file_actions_init(&actions_); }
  ~FileActions() { posix_spawn_file_actions_destroy(&actions_); }
  FileActions(const FileActions&) = delete;
  FileActions& operator=(const FileActions&) = delete;

  posix_spawn_file_actions_t* get() { return &actions_; }

 private:
  posix_spawn_file_actions_t actions_;
};

// The child's environment: fitrund's with `env` on top, or for a child run as an account a clean
// one (see SpawnOptions::run_as).
std::vector<std::string> ChildEnvironment(const SpawnOptions& options) {
  std::map<std::string, std::string> env;
  auto inherit = [&env](const char* key) {
    if (const char* value = std::getenv(key); value != nullptr) env[key] = value;
  };
  if (options.run_as.has_value()) {
    const UnixAccount& account = *options.run_as;
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin";
    env["HOME"] = account.home;
    env["USER"] = account.name;
    env["LOGNAME"] = account.name;
    env["SHELL"] = account.shell.empty() ? "/bin/sh" : account.shell;
    for (const char* key : {"LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                            "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"}) {
      inherit(key);
    }
  } else {
    for (char** e = environ; *e != nullptr; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
    }
  }
  for (const auto& [key, value] : options.env) env[key] = value;
  std::vector<std::string> strings;
  strings.reserve(env.size());
  for (const auto& [key, value] : env) strings.push_back(key + "=" + value);
  return strings;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

absl::StatusOr<pid_t> PosixSpawn(const SpawnOptions& options, char* const argv[], char* const envp[]) {
  FileActions actions;
  if (!options.working_dir.empty()) {
    posix_spawn_file_actions_addchdir_np(actions.get(), options.working_dir.c_str());
  }
  if (options.stdin_fd >= 0) {
    posix_spawn_file_actions_adddup2(actions.get(), options.stdin_fd, 0);
  } else {
    posix_spawn_file_actions_addopen(actions.get(), 0, "/dev/null", O_RDONLY, 0);
  }
  if (!options.output_path.empty()) {
    // Non-blocking: a FIFO left in its place must not stop the child's start (posix_spawn waits for it).
    posix_spawn_file_actions_addopen(actions.get(), 1, options.output_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK, 0644);
    posix_spawn_file_actions_adddup2(actions.get(), 1, 2);
  } else {
    if (options.stdout_fd >= 0) posix_spawn_file_actions_adddup2(actions.get(), options.stdout_fd, 1);
    if (options.stderr_fd >= 0) posix_spawn_file_actions_adddup2(actions.get(), options.stderr_fd, 2);
  }
  const SpawnAttributes attributes(options.own_process_group);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], actions.get(), attributes.get(), argv, envp);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", options.argv[0], ": ", std::strerror(rc)));
  return pid;
}

// The steps of ForkExec's child, for the parent's message when one fails.
enum ChildStep : int {
  kSignals,
  kSession,
  kJoinCgroup,
  kStreams,
  kGroups,
  kGid,
  kUid,
  kNoNewPrivileges,
  kWorkingDir,
  kOutputFile,
  kOutputNotAFile,
  kDescriptors,
  kSecret,
  kLimits,
  kExec,
};
const char* DescribeStep(int step) {
  switch (step) {
    case kSignals: return "resetting signals";
    case kSession: return "starting its own session";
    case kJoinCgroup: return "joining its cgroup";
    case kStreams: return "setting up its standard streams";
    case kGroups: return "setting its groups";
    case kGid: return "setting its gid";
    case kUid: return "setting its uid";
    case kNoNewPrivileges: return "setting no_new_privs";
    case kWorkingDir: return "entering its working directory";
    case kOutputFile: return "opening its output file";
    case kOutputNotAFile: return "opening its output file, which is a FIFO, a socket or a symbolic link, not a file";
    case kDescriptors: return "closing fitrund's descriptors";
    case kSecret: return "taking its secret's descriptor";
    case kLimits: return "setting its resource limits";
    default: return "exec";
  }
}

// fork and exec, for what posix_spawn cannot do: switch accounts and join cgroups. Between fork
// and exec the child makes only async-signal-safe calls (fitrund has many threads); everything it
// needs is prepared here first. A failing step writes {step, errno} to a close-on-exec pipe, so the
// parent reads either that or end-of-file (the exec happened).
absl::StatusOr<pid_t> ForkExec(const SpawnOptions& options, char* const argv[], char* const envp[]) {
  std::vector<int> cgroup_fds;
  auto close_cgroups = [&cgroup_fds] {
    for (int& fd : cgroup_fds) CloseFd(&fd);
  };
  for (const std::string& procs : options.cgroup_procs_files) {
    const int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      close_cgroups();
      return absl::InternalError(absl::StrCat("cannot start ", options.argv[0], ": opening ", procs, ": ",
                                              std::strerror(error)));
    }
    cgroup_fds.push_back(fd);
  }
  absl::StatusOr<Pipe> report = MakePipe();
  if (!report.ok()) {
    close_cgroups();
    return report.status();
  }
  // Above the descriptor the secret goes to, which the child's dup2 would otherwise close.
  for (int* end : {&report->read_end, &report->write_end}) {
    const int moved = fcntl(*end, F_DUPFD_CLOEXEC, std::max(options.secret_target, 2) + 1);
    if (moved >= 0) {
      close(*end);
      *end = moved;
    }
  }
  struct rlimit open_files_now {};
  getrlimit(RLIMIT_NOFILE, &open_files_now);
  const rlim_t rank_open_files = open_files_now.rlim_max == RLIM_INFINITY
                                     ? static_cast<rlim_t>(kRankOpenFiles)
                                     : std::min<rlim_t>(open_files_now.rlim_max, kRankOpenFiles);
  const UnixAccount* account = options.run_as.has_value() ? &*options.run_as : nullptr;
  const bool new_session = account != nullptr || options.own_process_group;
  struct rlimit files {};
  getrlimit(RLIMIT_NOFILE, &files);
  const int max_fd = files.rlim_cur == RLIM_INFINITY || files.rlim_cur > 1048576 ? 1048576
                                                                                 : static_cast<int>(files.rlim_cur);

  const pid_t pid = fork();
  if (pid == 0) {
    const int report_fd = report->write_end;
    auto fail = [report_fd](int step) {
      const int failure[2] = {step, errno};
      ssize_t ignored = write(report_fd, failure, sizeof(failure));
      (void)ignored;
      _exit(127);
    };
    sigset_t empty;
    sigemptyset(&empty);
    for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP, SIGCHLD}) {
      if (signal(sig, SIG_DFL) == SIG_ERR) fail(kSignals);
    }
    if (sigprocmask(SIG_SETMASK, &empty, nullptr) != 0) fail(kSignals);
    // A session of its own is a process group of its own, detached from any terminal.
    if (new_session && setsid() < 0) fail(kSession);
    for (int fd : cgroup_fds) {
      if (write(fd, "0", 1) != 1) fail(kJoinCgroup);
    }
    // Standard input and the descriptors handed in, before the account changes.
    const int in = options.stdin_fd >= 0 ? options.stdin_fd : open("/dev/null", O_RDONLY);
    if (in < 0 || dup2(in, 0) < 0) fail(kStreams);
    if (options.output_path.empty()) {
      if (options.stdout_fd >= 0 && dup2(options.stdout_fd, 1) < 0) fail(kStreams);
      if (options.stderr_fd >= 0 && dup2(options.stderr_fd, 2) < 0) fail(kStreams);
    }
    if (options.secret_fd >= 0) {
      // dup2 onto itself would keep close-on-exec; the copy never has it.
      const int kept = options.secret_fd == options.secret_target
                           ? fcntl(options.secret_target, F_SETFD, 0)
                           : dup2(options.secret_fd, options.secret_target);
      if (kept < 0) fail(kSecret);
    }
    if (options.rank_limits) {
      const struct rlimit no_core {0, 0};
      const struct rlimit open_files {rank_open_files, rank_open_files};
      if (setrlimit(RLIMIT_CORE, &no_core) != 0 || setrlimit(RLIMIT_NOFILE, &open_files) != 0) fail(kLimits);
    }
    if (account != nullptr) {
      if (setgroups(account->groups.size(), account->groups.data()) != 0) fail(kGroups);
      if (setresgid(account->gid, account->gid, account->gid) != 0) fail(kGid);
      if (setresuid(account->uid, account->uid, account->uid) != 0) fail(kUid);
      if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(kNoNewPrivileges);
    }
    if (!options.working_dir.empty() && chdir(options.working_dir.c_str()) != 0) fail(kWorkingDir);
    if (!options.output_path.empty()) {
      // As the account: it may only append to a file it could write itself. The account also decides
      // what is at that path: a FIFO would hold this open until a reader came, and fitrund waits for
      // this child's exec, so it opens non-blocking and refuses a FIFO (ENXIO without a reader), a
      // socket or a symbolic link.
      const int out = open(options.output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK, 0644);
      if (out < 0) fail(errno == ENXIO || errno == ELOOP ? kOutputNotAFile : kOutputFile);
      struct stat info {};
      if (fstat(out, &info) != 0) fail(kOutputFile);
      if (S_ISFIFO(info.st_mode) || S_ISSOCK(info.st_mode)) {
        errno = EINVAL;
        fail(kOutputNotAFile);
      }
      const int flags = fcntl(out, F_GETFL);
      if (flags < 0 || fcntl(out, F_SETFL, flags & ~O_NONBLOCK) != 0) fail(kOutputFile);
      if (dup2(out, 1) < 0 || dup2(out, 2) < 0) fail(kOutputFile);
      if (out > 2) close(out);
    }
    // Nothing of fitrund's beyond the standard streams survives the exec, whether or not it was
    // opened close-on-exec (the report pipe must stay open until the exec: it is close-on-exec).
    for (int fd = 3; fd < max_fd; ++fd) {
      if (fd != report_fd && !(options.secret_fd >= 0 && fd == options.secret_target)) fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    execve(argv[0], argv, envp);
    fail(kExec);
  }
  const int fork_error = errno;
  close_cgroups();
  CloseFd(&report->write_end);
  if (pid < 0) {
    CloseFd(&report->read_end);
    return absl::InternalError(absl::StrCat("cannot start ", options.argv[0], ": fork: ", std::strerror(fork_error)));
  }
  // The child's steps before its exec touch what the account controls (its working directory, its
  // output file: a stalled FUSE mount, say), and fitrund's callers hold locks while they wait here:
  // a child that has not exec'd by the deadline is killed.
  pollfd ready{report->read_end, POLLIN, 0};
  int polled;
  const int deadline_ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options.exec_deadline)));
  while ((polled = poll(&ready, 1, deadline_ms)) < 0 && errno == EINTR) {
  }
  if (polled == 0) {
    CloseFd(&report->read_end);
    kill(pid, SIGKILL);
    // Reaped on a thread of its own: a child stuck in the kernel dies only when the kernel lets it.
    std::thread([pid] { Reap(pid); }).detach();
    return absl::DeadlineExceededError(
        absl::StrCat("cannot start ", options.argv[0], account != nullptr ? absl::StrCat(" as ", account->name) : "",
                     ": it did not reach its exec within ", absl::FormatDuration(options.exec_deadline),
                     " (its working directory or output file did not answer)"));
  }
  int failure[2] = {0, 0};
  ssize_t n;
  while ((n = read(report->read_end, failure, sizeof(failure))) < 0 && errno == EINTR) {
  }
  CloseFd(&report->read_end);
  if (n == 0) return pid;  // the exec closed the pipe
  Reap(pid);
  const std::string as = account != nullptr ? absl::StrCat(" as ", account->name) : "";
  return absl::InternalError(absl::StrCat("cannot start ", options.argv[0], as, ": ", DescribeStep(failure[0]),
                                          n == static_cast<ssize_t>(sizeof(failure))
                                              ? absl::StrCat(": ", std::strerror(failure[1]))
                                              : std::string()));
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("spawn: argv is empty");
  std::vector<std::string> env_strings = ChildEnvironment(options);
  std::vector<char*> envp = Pointers(env_strings);
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv = Pointers(args);
  // posix_spawn (vfork underneath) is the fast path; an account switch, a cgroup, a secret's
  // descriptor or a rank's limits need fork.
  if (options.run_as.has_value() || !options.cgroup_procs_files.empty() || options.secret_fd >= 0 ||
      options.rank_limits) {
    return ForkExec(options, argv.data(), envp.data());
  }
  return PosixSpawn(options, argv.data(), envp.data());
}


absl::StatusOr<Pipe> MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  return Pipe{fds[0], fds[1]};
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

absl::Status WriteToPipeWithin(int fd, std::string_view bytes, absl::Duration deadline) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("fcntl: ", std::strerror(errno)));
  }
  const absl::Time give_up = absl::Now() + deadline;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return absl::UnavailableError(absl::StrCat("write: ", std::strerror(errno)));
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("the reader took ", done, " of ", bytes.size(), " bytes in ",
                                                      absl::FormatDuration(deadline)));
    }
    pollfd writable{fd, POLLOUT, 0};
    if (poll(&writable, 1, static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left)))) < 0 &&
        errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

std::string ChildExit::Describe() const {
  return signal != 0 ? absl::StrCat("was killed by signal ", signal) : absl::StrCat("exited with ", exit_code);
}

ChildExit ChildExitFromWaitStatus(int status) {
  ChildExit exit;
  if (WIFSIGNALED(status)) {
    exit.exit_code = -1;
    exit.signal = WTERMSIG(status);
  } else {
    exit.exit_code = WEXITSTATUS(status);
  }
  return exit;
}

ChildExit Reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return ChildExitFromWaitStatus(status);
}

}  // namespace fitrun::server
