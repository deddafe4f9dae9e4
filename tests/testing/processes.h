// Helpers for multi-process tests: real binaries from the test's runfiles, started without a shell
// in their own process groups, waited on by condition with a deadline, and always cleaned up.
#ifndef FITRUN_TESTS_TESTING_PROCESSES_H_
#define FITRUN_TESTS_TESTING_PROCESSES_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace fitrun::testing {

// Path of a binary built by this workspace, e.g. Runfile("server/fitrund").
std::string Runfile(const std::string& path);

// The test's own temporary directory (TEST_TMPDIR).
std::string TestTmpDir();

// A fresh, empty directory for this test under TEST_TMPDIR.
std::string FreshTestDir(const std::string& name);

// Polls `condition` every few milliseconds until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout);

// A child process. The destructor SIGKILLs its process group if it is still running.
class Subprocess {
 public:
  // stdout and stderr go to `log_path` (appended).
  Subprocess(std::vector<std::string> argv, std::string log_path,
             std::map<std::string, std::string> extra_env = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  void Signal(int sig);
  // Waits for the process to exit; returns its wait status, or -1 on timeout.
  int Wait(absl::Duration timeout);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// Runs a command to completion (no shell) and returns its exit code with its stdout and stderr.
struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout = absl::Seconds(120));

// Worker processes whose FITRUN_ASSIGNMENT lies under `state_dir` (found through /proc), so a test
// can prove none was left behind and kill any that were.
std::vector<pid_t> WorkersUnder(const std::string& state_dir);
void KillWorkersUnder(const std::string& state_dir);

std::string ReadFile(const std::string& path);

}  // namespace fitrun::testing

#endif  // FITRUN_TESTS_TESTING_PROCESSES_H_
