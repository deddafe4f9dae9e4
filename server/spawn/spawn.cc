#include "server/spawn/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"

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

}  // namespace

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("spawn: argv is empty");

  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [key, value] : options.env) env[key] = value;
  std::vector<std::string> env_strings;
  env_strings.reserve(env.size());
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

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
    posix_spawn_file_actions_addopen(actions.get(), 1, options.output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(actions.get(), 1, 2);
  } else {
    if (options.stdout_fd >= 0) posix_spawn_file_actions_adddup2(actions.get(), options.stdout_fd, 1);
    if (options.stderr_fd >= 0) posix_spawn_file_actions_adddup2(actions.get(), options.stderr_fd, 2);
  }
  const SpawnAttributes attributes(options.own_process_group);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], actions.get(), attributes.get(), argv.data(), envp.data());
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", options.argv[0], ": ", std::strerror(rc)));
  return pid;
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
