#include "tests/testing/processes.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace fitrun::testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "fitrun", "/", path);
}

std::string TestTmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

std::string FreshTestDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(TestTmpDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

namespace {

pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path,
            const std::map<std::string, std::string>& extra_env) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (!extra_env.count(key)) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : extra_env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& s : args) cargv.push_back(s.data());
  cargv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (err_path == out_path) {
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  } else {
    posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  if (posix_spawn(&pid, cargv[0], &actions, &attr, cargv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return pid;
}

}  // namespace

Subprocess::Subprocess(std::vector<std::string> argv, std::string log_path,
                       std::map<std::string, std::string> extra_env) {
  pid_ = Spawn(argv, log_path, log_path, extra_env);
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    kill(-pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
}

bool Subprocess::Running() {
  if (pid_ <= 0 || reaped_) return false;
  if (waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

void Subprocess::Signal(int sig) {
  if (Running()) kill(pid_, sig);
}

int Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  if (!WaitFor([this] { return !Running(); }, timeout)) return -1;
  return status_;
}

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  const std::string dir = FreshTestDir(absl::StrCat("cmd-", getpid(), "-", rand()));
  const std::string out = dir + "/out";
  const std::string err = dir + "/err";
  CommandResult result;
  const pid_t pid = Spawn(argv, out, err, {});
  if (pid <= 0) return result;
  int status = 0;
  const bool done = WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout);
  if (!done) {
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    result.exit_code = -1;
  } else {
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  result.out = ReadFile(out);
  result.err = ReadFile(err);
  return result;
}

std::vector<pid_t> WorkersUnder(const std::string& state_dir) {
  std::vector<pid_t> pids;
  const std::string needle = "FITRUN_ASSIGNMENT=" + state_dir;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    const std::string environ_text = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    for (absl::string_view var : absl::StrSplit(environ_text, '\0')) {
      if (absl::StartsWith(var, needle)) {
        // A zombie has exited; only the living count.
        const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
        const size_t paren = stat.rfind(')');
        if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') break;
        pids.push_back(pid);
        break;
      }
    }
  }
  closedir(proc);
  return pids;
}

void KillWorkersUnder(const std::string& state_dir) {
  for (pid_t pid : WorkersUnder(state_dir)) kill(pid, SIGKILL);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace fitrun::testing
