#include "server/launcher/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/contract/launch_contract.h"
#include "server/spawn/spawn.h"

namespace fitrun::server {

namespace launch = fitrun::contract::launch;

namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool PidfdSignal(int pidfd, int signal) {
  return syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0) == 0;
}

// The real uid of the process (/proc/<pid>/status's first Uid: field), or -1.
int64_t RealUid(pid_t pid) {
  for (absl::string_view line : absl::StrSplit(ReadProcFile(pid, "status"), '\n')) {
    if (!absl::ConsumePrefix(&line, "Uid:")) continue;
    std::vector<absl::string_view> ids = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t uid = -1;
    if (!ids.empty() && absl::SimpleAtoi(ids[0], &uid)) return uid;
  }
  return -1;
}

// Why the process at `pid` is not `identity`; empty when it is.
std::string Differs(pid_t pid, const ProcessLauncher::Identity& identity) {
  std::set<std::string> variables;
  for (absl::string_view v : absl::StrSplit(ReadProcFile(pid, "environ"), '\0')) variables.emplace(v);
  for (const auto& [key, value] : identity.env) {
    if (!variables.count(key + "=" + value)) return absl::StrCat(key, " differs");
  }
  if (const int64_t uid = RealUid(pid); uid != static_cast<int64_t>(identity.uid)) {
    return absl::StrCat("it runs as uid ", uid, ", not ", identity.uid);
  }
  if (identity.start_ticks > 0 && ProcessStartTicks(pid) != identity.start_ticks) {
    return "it started after the rank did (its pid was recycled)";
  }
  if (identity.in_cgroup && !identity.in_cgroup(pid)) return "it is not in the attempt's cgroup";
  return "";
}

}  // namespace

std::string ReadProcFile(pid_t pid, const char* name) {
  const int fd = open(absl::StrCat("/proc/", pid, "/", name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      text.clear();
      break;
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

int64_t ProcessStartTicks(int pid) {
  const std::string stat = ReadProcFile(pid, "stat");
  // After the command's closing parenthesis (the command may hold spaces): state is field 3.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<absl::string_view> fields = absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  int64_t ticks = 0;
  return fields.size() > 19 && absl::SimpleAtoi(fields[19], &ticks) ? ticks : 0;  // field 22
}

ProcessLauncher::ProcessLauncher() {
  killer_ = std::thread([this] { KillerLoop(); });
}

ProcessLauncher::~ProcessLauncher() {
  std::map<int64_t, std::thread> waiters;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [pid, pidfd] : alive_) SignalLocked(pid, SIGKILL);
    waiters.swap(waiters_);
  }
  for (auto& [id, thread] : waiters) thread.join();
  killer_.join();
}

absl::StatusOr<int> ProcessLauncher::Launch(const WorkerLaunch& launch, ExitCallback on_exit,
                                            const std::vector<std::string>& cgroup_procs_files) {
  if (launch.argv.empty()) return absl::InvalidArgumentError("launch.argv is empty");
  SpawnOptions spawn;
  spawn.argv = launch.argv;
  spawn.env.assign(launch.env.begin(), launch.env.end());
  spawn.working_dir = launch.working_dir;
  spawn.output_path = launch.log_path;
  spawn.own_process_group = true;
  spawn.run_as = launch.run_as;
  spawn.cgroup_procs_files = cgroup_procs_files;
  spawn.rank_limits = true;
  // The job token as launch_contract.h says: to a rank run as another account through a pipe only
  // it holds (a pipe's buffer takes the token whole, so the write never waits for the reader).
  Pipe token{};
  if (!launch.job_token.empty() && !launch.run_as.has_value()) {
    spawn.env.emplace_back(launch::kJobToken, launch.job_token);
  } else if (!launch.job_token.empty()) {
    absl::StatusOr<Pipe> pipe = MakePipe();
    if (!pipe.ok()) return pipe.status();
    token = *pipe;
    const bool written = write(token.write_end, launch.job_token.data(), launch.job_token.size()) ==
                         static_cast<ssize_t>(launch.job_token.size());
    CloseFd(&token.write_end);
    if (!written) {
      CloseFd(&token.read_end);
      return absl::InternalError("cannot hand the rank its job token (a pipe write failed)");
    }
    spawn.secret_fd = token.read_end;
    spawn.secret_target = launch::kJobTokenDescriptor;
    spawn.env.emplace_back(launch::kJobTokenFd, absl::StrCat(launch::kJobTokenDescriptor));
  }

  absl::MutexLock lock(&mu_);
  absl::StatusOr<pid_t> pid = stopping_ ? absl::UnavailableError("the launcher is shutting down") : Spawn(spawn);
  CloseFd(&token.read_end);
  if (!pid.ok()) return pid.status();
  alive_[*pid] = PidfdOpen(*pid);  // our child, not reaped yet: the pid is still its
  StartWaiter([this, pid = *pid, on_exit = std::move(on_exit)](int64_t waiter) { Wait(pid, waiter, on_exit); });
  return static_cast<int>(*pid);
}

absl::StatusOr<ProcessLauncher::Warm> ProcessLauncher::StartWarm(const std::vector<std::string>& argv,
                                                                  const std::optional<UnixAccount>& run_as,
                                                                  const std::string& warm_id, ExitCallback on_exit) {
  if (argv.empty()) return absl::InvalidArgumentError("argv is empty");
  absl::StatusOr<Pipe> identity = MakePipe();
  if (!identity.ok()) return identity.status();
  SpawnOptions spawn;
  spawn.argv = argv;
  spawn.env = {{launch::kWarmFd, absl::StrCat(launch::kJobTokenDescriptor)},
               {launch::kWarmRank, warm_id},
               {launch::kOpenBlasThreads, "1"}};
  spawn.working_dir = "/";
  spawn.output_path = "/dev/null";  // its job's log is its own to open once it has a job
  spawn.own_process_group = true;
  spawn.run_as = run_as;
  spawn.rank_limits = true;
  spawn.secret_fd = identity->read_end;
  spawn.secret_target = launch::kJobTokenDescriptor;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<pid_t> pid = stopping_ ? absl::UnavailableError("the launcher is shutting down") : Spawn(spawn);
  CloseFd(&identity->read_end);
  if (!pid.ok()) {
    CloseFd(&identity->write_end);
    return pid.status();
  }
  alive_[*pid] = PidfdOpen(*pid);
  StartWaiter([this, pid = *pid, on_exit = std::move(on_exit)](int64_t waiter) { Wait(pid, waiter, on_exit); });
  return Warm{static_cast<int>(*pid), identity->write_end};
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

absl::StatusOr<int> ProcessLauncher::Adopt(int pid, const Identity& identity, ExitCallback on_exit) {
  const int pidfd = PidfdOpen(pid);
  if (pidfd < 0) return absl::NotFoundError(absl::StrCat("process ", pid, " is gone"));
  // Read after the pidfd pins a process, and checked against it afterwards: if it is still alive,
  // everything read was of that process, not of one that took its pid meanwhile.
  std::string differs = Differs(pid, identity);
  if (differs.empty() && !PidfdSignal(pidfd, 0)) differs = "it exited meanwhile";
  if (!differs.empty()) {
    close(pidfd);
    return absl::NotFoundError(absl::StrCat("process ", pid, " is not the expected worker: ", differs));
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    close(pidfd);
    return absl::UnavailableError("the launcher is shutting down");
  }
  alive_[pid] = dup(pidfd);  // the waiter polls its own, and closes it
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
    ForgetLocked(pid);
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
    ForgetLocked(pid);
  }
  const ChildExit ended = Reap(pid);
  WorkerExit exit;
  exit.exit_code = ended.exit_code;
  exit.signal = ended.signal;
  on_exit(exit);
  absl::MutexLock lock(&mu_);
  finished_waiters_.push_back(waiter);
}

void ProcessLauncher::SignalLocked(pid_t pid, int signal) {
  auto it = alive_.find(pid);
  if (it == alive_.end()) return;
  // A pidfd that failed to open (none: -1) leaves the child's own reaping as the guard.
  if (it->second >= 0 && !PidfdSignal(it->second, signal)) return;
  kill(-pid, signal);  // the rest of its group: the leader is alive, so the group id is still its
}

void ProcessLauncher::ForgetLocked(pid_t pid) {
  auto it = alive_.find(pid);
  if (it == alive_.end()) return;
  if (it->second >= 0) close(it->second);
  alive_.erase(it);
}

void ProcessLauncher::KillNow(int handle) {
  absl::MutexLock lock(&mu_);
  SignalLocked(static_cast<pid_t>(handle), SIGKILL);
}

absl::Status ProcessLauncher::WhileAlive(int handle, const std::function<absl::Status()>& body) {
  absl::MutexLock lock(&mu_);
  if (!alive_.count(static_cast<pid_t>(handle))) {
    return absl::FailedPreconditionError(absl::StrCat("process ", handle, " is gone"));
  }
  return body();
}

void ProcessLauncher::Stop(int handle, absl::Duration grace) {
  const pid_t pid = static_cast<pid_t>(handle);
  absl::MutexLock lock(&mu_);
  if (!alive_.count(pid)) return;
  SignalLocked(pid, SIGTERM);
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
    auto wake = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || (!kill_deadlines_.empty() && kill_deadlines_.begin()->first < next); };
    mu_.AwaitWithDeadline(absl::Condition(&wake), next);
    const absl::Time now = absl::Now();
    while (!kill_deadlines_.empty() && kill_deadlines_.begin()->first <= now) {
      const pid_t pid = kill_deadlines_.begin()->second;
      kill_deadlines_.erase(kill_deadlines_.begin());
      SignalLocked(pid, SIGKILL);
    }
  }
}

}  // namespace fitrun::server
