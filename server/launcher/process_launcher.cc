#include "server/launcher/process_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/launcher/child_spawn.h"

extern char** environ;

namespace fitrun::server {

ProcessLauncher::ProcessLauncher() {
  killer_ = std::thread([this] { KillerLoop(); });
}

ProcessLauncher::~ProcessLauncher() {
  std::map<int64_t, std::thread> waiters;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [pid, alive] : alive_) kill(-pid, SIGKILL);
    waiters.swap(waiters_);
  }
  for (auto& [id, thread] : waiters) thread.join();
  killer_.join();
}

absl::StatusOr<int> ProcessLauncher::Launch(const WorkerLaunch& launch, ExitCallback on_exit) {
  if (launch.argv.empty()) return absl::InvalidArgumentError("launch.argv is empty");

  // The worker inherits the coordinator's environment (PATH, library and BLAS settings) with the
  // launch's variables on top.
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [key, value] : launch.env) env[key] = value;
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = launch.argv;
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!launch.working_dir.empty()) posix_spawn_file_actions_addchdir_np(&actions, launch.working_dir.c_str());
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (!launch.log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, launch.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  const ChildSpawnAttributes attributes(/*own_process_group=*/true);

  pid_t pid = 0;
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the launcher is shutting down");
  const int rc = posix_spawn(&pid, argv[0], &actions, attributes.get(), argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", launch.argv[0], ": ", std::strerror(rc)));
  }
  alive_[pid] = true;
  StartWaiter([this, pid, on_exit = std::move(on_exit)](int64_t waiter) { Wait(pid, waiter, on_exit); });
  return static_cast<int>(pid);
}

void ProcessLauncher::StartWaiter(std::function<void(int64_t)> body) {
  for (int64_t done : finished_waiters_) {
    auto it = waiters_.find(done);
    if (it == waiters_.end()) continue;
    it->second.join();
    waiters_.erase(it);
  }
  finished_waiters_.clear();
  const int64_t waiter = next_waiter_++;
  waiters_[waiter] = std::thread([body = std::move(body), waiter] { body(waiter); });
}

absl::StatusOr<int> ProcessLauncher::Adopt(int pid, const std::vector<std::pair<std::string, std::string>>& expected_env,
                                           ExitCallback on_exit) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return absl::NotFoundError(absl::StrCat("process ", pid, " is gone"));
  // Read the environment only after the pidfd pins the process, so it cannot be a recycled pid.
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
  const std::string environ_text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::set<std::string> variables;
  for (absl::string_view v : absl::StrSplit(environ_text, '\0')) variables.emplace(v);
  for (const auto& [key, value] : expected_env) {
    if (!variables.count(key + "=" + value)) {
      close(pidfd);
      return absl::NotFoundError(absl::StrCat("process ", pid, " is not the expected worker (", key, " differs)"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    close(pidfd);
    return absl::UnavailableError("the launcher is shutting down");
  }
  alive_[pid] = true;
  StartWaiter([this, pid, pidfd, on_exit = std::move(on_exit)](int64_t waiter) {
    WaitAdopted(pid, pidfd, waiter, on_exit);
  });
  return pid;
}

void ProcessLauncher::WaitAdopted(pid_t pid, int pidfd, int64_t waiter, ExitCallback on_exit) {
  pollfd fd{pidfd, POLLIN, 0};
  while (poll(&fd, 1, -1) < 0 && errno == EINTR) {
  }
  {
    absl::MutexLock lock(&mu_);
    alive_.erase(pid);
  }
  close(pidfd);
  WorkerExit exit;
  exit.status_known = false;
  on_exit(exit);
  absl::MutexLock lock(&mu_);
  finished_waiters_.push_back(waiter);
}

void ProcessLauncher::Wait(pid_t pid, int64_t waiter, ExitCallback on_exit) {
  // Wait without reaping, forget the pid, then reap: no signal can reach a recycled pid.
  siginfo_t info{};
  while (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  {
    absl::MutexLock lock(&mu_);
    alive_.erase(pid);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  WorkerExit exit;
  if (WIFSIGNALED(status)) {
    exit.exit_code = -1;
    exit.signal = WTERMSIG(status);
  } else {
    exit.exit_code = WEXITSTATUS(status);
  }
  on_exit(exit);
  absl::MutexLock lock(&mu_);
  finished_waiters_.push_back(waiter);
}

void ProcessLauncher::Stop(int handle, absl::Duration grace) {
  const pid_t pid = static_cast<pid_t>(handle);
  absl::MutexLock lock(&mu_);
  if (!alive_.count(pid)) return;
  kill(-pid, SIGTERM);
  kill_deadlines_.emplace(absl::Now() + grace, pid);
}

void ProcessLauncher::KillIfStillRunningAfter(int handle, absl::Duration grace) {
  const pid_t pid = static_cast<pid_t>(handle);
  absl::MutexLock lock(&mu_);
  if (!alive_.count(pid)) return;
  kill_deadlines_.emplace(absl::Now() + grace, pid);
}

void ProcessLauncher::KillerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time next = kill_deadlines_.empty() ? absl::InfiniteFuture() : kill_deadlines_.begin()->first;
    auto wake = [this, next] { return stopping_ || (!kill_deadlines_.empty() && kill_deadlines_.begin()->first < next); };
    mu_.AwaitWithDeadline(absl::Condition(&wake), next);
    const absl::Time now = absl::Now();
    while (!kill_deadlines_.empty() && kill_deadlines_.begin()->first <= now) {
      const pid_t pid = kill_deadlines_.begin()->second;
      kill_deadlines_.erase(kill_deadlines_.begin());
      if (alive_.count(pid)) kill(-pid, SIGKILL);
    }
  }
}

absl::StatusOr<int> PickFreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("picking a free port: ", std::strerror(err)));
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace fitrun::server
