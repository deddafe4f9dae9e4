#include "worker/script/script_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/contract/find_command.h"
#include "proto/contract/install_layout.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"

extern char** environ;

namespace fitrun::worker {
namespace launch = fitrun::contract::launch;
namespace meter = fitrun::contract::meter;
namespace {

constexpr size_t kStderrTailBytes = 4096;

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// argv[0] as this process was started with: a runfiles path keeps its runfiles tree beside it, which
// /proc/self/exe (the resolved file) would not.
std::string OwnArgv0() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string first;
  std::getline(in, first, '\0');
  if (!first.empty() && first[0] != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) first = absl::StrCat(cwd, "/", first);
  }
  return first;
}

}  // namespace

SupportFiles FindSupportFiles() {
  namespace layout = fitrun::contract::layout;
  // Under this program's layout root (proto/contract/install_layout.h): its runfiles, or the folder
  // above worker/ (bazel-bin/, a runfiles tree, the package's /usr/lib/fitrun/).
  const std::vector<std::string> roots = layout::RootsOf(OwnArgv0(), /*from_worker=*/true);
  SupportFiles files;
  files.memory_library = layout::FindUnder(roots, layout::kMemoryLibrary);
  const std::string module = layout::FindUnder(roots, layout::kPythonModule);
  if (!module.empty()) {
    files.python_path = Dirname(Dirname(module));  // client/python, above fitrun/__init__.py
  }
  return files;
}

absl::StatusOr<ScriptCommand> ScriptCommandFor(const fitrun::v1::JobSpec& spec, const ScriptRunSettings& settings,
                                               const SupportFiles& support) {
  const fitrun::v1::ScriptSpec& script = spec.script();
  if (script.command().empty()) {
    return absl::InvalidArgumentError("spec.script.command: empty (an argv such as [/usr/bin/python3, train.py])");
  }
  ScriptCommand command;
  command.working_dir = script.working_dir();
  absl::StatusOr<std::string> executable = fitrun::contract::launch::FindCommand(script.command(0), command.working_dir);
  if (!executable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.script.command[0]: ", executable.status().message()));
  }
  command.executable = *executable;
  command.argv.assign(script.command().begin(), script.command().end());
  if (!script.grad_accum_flag().empty() && settings.grad_accum_steps > 0) {
    command.argv.push_back(script.grad_accum_flag());
    command.argv.push_back(absl::StrCat(settings.grad_accum_steps));
  }
  if (!script.batch_flag().empty() && settings.per_device_batch > 0) {
    command.argv.push_back(script.batch_flag());
    command.argv.push_back(absl::StrCat(settings.per_device_batch));
  }

  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  // The supervisor reports for the script; the script needs neither the address nor the token.
  env.erase(launch::kCoordinator);
  env.erase(launch::kJobToken);
  env.erase(launch::kJobTokenFd);
  for (const auto& [key, value] : script.env()) env[key] = value;
  for (const auto& [key, value] : settings.extra_env) env[key] = value;
  env[launch::kRank] = absl::StrCat(settings.rank);
  env[launch::kWorldSize] = absl::StrCat(settings.world_size);
  env[launch::kPerDeviceBatch] = absl::StrCat(settings.per_device_batch);
  env[launch::kGradAccumSteps] = absl::StrCat(std::max<int64_t>(1, settings.grad_accum_steps));
  env[launch::kLearningRate] = absl::StrCat(settings.learning_rate);
  env[launch::kGlobalBatchSize] = absl::StrCat(settings.global_batch_size);
  if (!settings.checkpoint_dir.empty()) env[launch::kCheckpointDir] = settings.checkpoint_dir;
  if (settings.max_steps > 0) env[launch::kMaxSteps] = absl::StrCat(settings.max_steps);
  if (settings.probe) env[launch::kProbe] = "1";
  env[launch::kActivationCheckpointing] =
      script.applies_strategy() && script.activation_checkpointing() ? "1" : "0";
  env[launch::kZeroStage] = absl::StrCat(script.applies_strategy() ? settings.zero_stage : 0);
  const fitrun::v1::Precision precision =
      spec.precision() == fitrun::v1::PRECISION_UNSPECIFIED ? fitrun::v1::PRECISION_FP32 : spec.precision();
  // PRECISION_BF16 -> "bf16": the proto's own names, lower-cased.
  env[launch::kPrecision] =
      absl::AsciiStrToLower(absl::StripPrefix(fitrun::v1::Precision_Name(precision), "PRECISION_"));
  // The allocator that makes a virtual CPU device's budget real for the script's tensors.
  if (!settings.preload_allocator && settings.memory_cap_bytes > 0) {
    env[launch::kMemoryCapBytes] = absl::StrCat(settings.memory_cap_bytes);
  }
  if (settings.preload_allocator && !support.memory_library.empty()) {
    const auto preload = env.find("LD_PRELOAD");
    env["LD_PRELOAD"] = preload == env.end() || preload->second.empty()
                            ? support.memory_library
                            : absl::StrCat(support.memory_library, ":", preload->second);
    env[launch::kMemoryCapBytes] = absl::StrCat(settings.memory_cap_bytes);
  }
  if (!support.python_path.empty()) {
    const auto path = env.find("PYTHONPATH");
    env["PYTHONPATH"] = path == env.end() || path->second.empty()
                            ? support.python_path
                            : absl::StrCat(support.python_path, ":", path->second);
  }
  // Python buffers a pipe's output; a rank log should show lines as they happen.
  env["PYTHONUNBUFFERED"] = "1";
  for (const auto& [key, value] : env) command.env.push_back(absl::StrCat(key, "=", value));
  return command;
}

absl::StatusOr<std::unique_ptr<ScriptProcess>> ScriptProcess::Start(const ScriptCommand& command,
                                                                    Callbacks callbacks) {
  int report[2], control[2], out[2], err[2];
  int* const pipes[] = {report, control, out, err};
  for (size_t made = 0; made < std::size(pipes); ++made) {
    if (pipe2(pipes[made], O_CLOEXEC) != 0) {
      const int error = errno;
      for (size_t i = 0; i < made; ++i) {
        close(pipes[i][0]);
        close(pipes[i][1]);
      }
      return absl::InternalError(absl::StrCat("pipe: ", std::strerror(error)));
    }
  }
  // The memory meter: without one the script still runs, and its figures read as zeros.
  meter::MemoryMeter* page = nullptr;
  const int meter_fd = meter::Create(&page);
  if (meter_fd < 0) {
    contract::LogWarning("no memory meter for the script (memfd_create: %s); its memory is not measured",
                         std::strerror(errno));
  }
  // Everything the child needs is built before fork: between fork and exec only async-signal-safe
  // calls are allowed in a threaded process.
  std::vector<std::string> env_strings;
  for (const std::string& variable : command.env) {
    if (!absl::StartsWith(variable, absl::StrCat(meter::kMemoryMeterFd, "="))) env_strings.push_back(variable);
  }
  env_strings.push_back(absl::StrCat(launch::kReportFd, "=", report[1]));
  env_strings.push_back(absl::StrCat(launch::kControlFd, "=", control[0]));
  if (meter_fd >= 0) env_strings.push_back(absl::StrCat(meter::kMemoryMeterFd, "=", meter_fd));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command.argv;
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const bool stdout_to_stderr = command.stdout_to_stderr;

  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    for (int fd : {report[0], report[1], control[0], control[1], out[0], out[1], err[0], err[1], meter_fd}) {
      if (fd >= 0) close(fd);
    }
    if (page != nullptr) munmap(page, meter::kPageBytes);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(error)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(launch::kExitStopped);
    dup2(err[1], STDERR_FILENO);
    dup2(stdout_to_stderr ? err[1] : out[1], STDOUT_FILENO);
    fcntl(report[1], F_SETFD, 0);
    fcntl(control[0], F_SETFD, 0);
    if (meter_fd >= 0) fcntl(meter_fd, F_SETFD, 0);
    if (!command.working_dir.empty() && chdir(command.working_dir.c_str()) != 0) {
      static const char kMessage[] = "fitrun-worker: cannot enter spec.script.working_dir\n";
      (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
      _exit(launch::kExitBadConfiguration);
    }
    execve(command.executable.c_str(), argv.data(), envp.data());
    static const char kMessage[] = "fitrun-worker: cannot execute spec.script.command\n";
    (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    _exit(launch::kExitBadConfiguration);
  }
  close(report[1]);
  close(control[0]);
  close(out[1]);
  close(err[1]);
  if (meter_fd >= 0) close(meter_fd);  // the mapping stays
  std::unique_ptr<ScriptProcess> process(new ScriptProcess());
  process->pid_ = pid;
  process->control_fd_ = control[1];
  process->meter_ = page;
  process->report_reader_ = std::thread([p = process.get(), fd = report[0], cb = callbacks.on_report_line] {
    p->ReadLines(fd, cb, /*keep_tail=*/false);
  });
  process->stdout_reader_ = std::thread([p = process.get(), fd = out[0], cb = callbacks.on_stdout_line] {
    p->ReadLines(fd, [&cb](const std::string& line) {
      std::fprintf(stdout, "%s\n", line.c_str());
      std::fflush(stdout);
      if (cb) cb(line);
    }, /*keep_tail=*/false);
  });
  process->stderr_reader_ = std::thread([p = process.get(), fd = err[0], cb = callbacks.on_stderr_line] {
    p->ReadLines(fd, [&cb](const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
      if (cb) cb(line);
    }, /*keep_tail=*/true);
  });
  return process;
}

void ScriptProcess::ReadLines(int fd, const std::function<void(const std::string&)>& on_line, bool keep_tail) {
  std::string pending;
  char buffer[8192];
  auto emit = [&](const std::string& line) {
    if (keep_tail) {
      absl::MutexLock lock(&mu_);
      absl::StrAppend(&stderr_tail_, line, "\n");
      if (stderr_tail_.size() > 2 * kStderrTailBytes) stderr_tail_.erase(0, stderr_tail_.size() - kStderrTailBytes);
    }
    if (on_line) on_line(line);
  };
  while (true) {
    pollfd ready{fd, POLLIN, 0};
    const int polled = poll(&ready, 1, 100);
    if (polled == 0) {
      if (absl::Now() > drain_deadline()) break;
      continue;
    }
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos; start = newline + 1) {
      emit(pending.substr(start, newline - start));
    }
    pending.erase(0, start);
  }
  if (!pending.empty()) emit(pending);
  close(fd);
}

void ScriptProcess::RequestStop(const std::string& reason) {
  const std::string line = absl::StrCat("stop ", reason, "\n");
  // MSG_NOSIGNAL does not apply to pipes: a script that closed its end must not kill us with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  (void)!write(control_fd_, line.data(), line.size());
}

void ScriptProcess::Signal(int signal) {
  if (!waited_ && pid_ > 0) kill(pid_, signal);
}

ScriptProcess::Exit ScriptProcess::Wait() {
  if (waited_) return exit_;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  waited_ = true;
  {
    absl::MutexLock lock(&mu_);
    drain_deadline_ = absl::Now() + absl::Seconds(2);
  }
  if (WIFSIGNALED(status)) {
    exit_.signaled = true;
    exit_.code = WTERMSIG(status);
  } else {
    exit_.code = WEXITSTATUS(status);
  }
  // The readers drain what the script wrote; a grandchild it left behind may hold the pipes open, so
  // they give up two seconds after the script's exit.
  if (report_reader_.joinable()) report_reader_.join();
  if (stdout_reader_.joinable()) stdout_reader_.join();
  if (stderr_reader_.joinable()) stderr_reader_.join();
  return exit_;
}

absl::Time ScriptProcess::drain_deadline() const {
  absl::MutexLock lock(&mu_);
  return drain_deadline_;
}

std::string ScriptProcess::StderrTail() const {
  absl::MutexLock lock(&mu_);
  if (stderr_tail_.size() <= kStderrTailBytes) return stderr_tail_;
  return stderr_tail_.substr(stderr_tail_.size() - kStderrTailBytes);
}

meter::MemoryReading ScriptProcess::Memory() const {
  return meter_ == nullptr ? meter::MemoryReading{} : meter::Read(*meter_);
}

ScriptProcess::~ScriptProcess() {
  if (!waited_) {
    Signal(SIGKILL);
    Wait();
  }
  if (control_fd_ >= 0) close(control_fd_);
  if (meter_ != nullptr) munmap(meter_, meter::kPageBytes);
}

}  // namespace fitrun::worker
