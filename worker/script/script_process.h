// A user's training script as one rank's child process: the argv and environment fitrun gives it
// (the torchrun variables, the plan's FITRUN_* ones, the preloaded memory cap and the Python module),
// and the running process with its report, control and stderr pipes. Shared by the script rank
// (worker/programs/script_rank.h) and the script memory probe (worker/probe/script_probe.h).
#ifndef FITRUN_WORKER_SCRIPT_SCRIPT_PROCESS_H_
#define FITRUN_WORKER_SCRIPT_SCRIPT_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fitrun/v1/worker.pb.h"
#include "proto/contract/memory_meter.h"
#include "worker/memory/oom_message.h"

namespace fitrun::worker {

// What one run of the script is told.
struct ScriptRunSettings {
  int rank = 0;
  int world_size = 1;
  int64_t per_device_batch = 0;
  int64_t grad_accum_steps = 1;
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  std::string checkpoint_dir;  // empty: none
  int64_t max_steps = 0;       // 0: the script's own length
  bool probe = false;
  // The plan's ZeRO stage: 1 shards the optimizer states over the ranks (a script that applies it).
  int zero_stage = 0;
  int64_t memory_cap_bytes = 0;  // 0: counted, not capped
  // Whether the script gets the capped CPU allocator preloaded (virtual CPU devices only).
  bool preload_allocator = true;
  // The torchrun variables that are not in this process's own environment (the probe sets them).
  std::map<std::string, std::string> extra_env;
};

// Where fitrun's support files are: the preloadable allocator and the Python module, found beside
// this binary (bazel-bin or a runfiles tree). Empty when absent.
struct SupportFiles {
  std::string memory_library;  // libfitrun_memory.so
  std::string python_path;     // the directory holding the `fitrun` package
};
SupportFiles FindSupportFiles();

struct ScriptCommand {
  std::string executable;  // resolved on PATH
  std::vector<std::string> argv;
  std::vector<std::string> env;  // KEY=VALUE
  std::string working_dir;
  // The probe keeps its own stdout for its answers.
  bool stdout_to_stderr = false;
};

// The command for `spec.script` under `settings`: the spec's argv (with batch_flag and the batch
// appended), run in its working_dir, with this process's environment, then spec.script.env, then
// fitrun's variables on top, the strategy among them (activation checkpointing as the spec, which
// the coordinator writes its plan's choice into, says). Errors name the spec field.
absl::StatusOr<ScriptCommand> ScriptCommandFor(const fitrun::v1::JobSpec& spec, const ScriptRunSettings& settings,
                                               const SupportFiles& support);

// The script, running. Its stdout and stderr are copied line by line to this process's (the rank
// log) and to `on_stdout_line` / `on_stderr_line`; each line it writes to the report descriptor goes
// to `on_report_line`. Its memory figures come through a memory meter this process makes for it
// (proto/contract/memory_meter.h: the preloaded allocator or the fitrun module writes them), readable
// at any time, during the run and after it. The child dies with this process (PR_SET_PDEATHSIG).
class ScriptProcess {
 public:
  struct Callbacks {
    std::function<void(const std::string& line)> on_report_line;
    std::function<void(const std::string& line)> on_stdout_line;
    std::function<void(const std::string& line)> on_stderr_line;
  };
  struct Exit {
    bool signaled = false;
    int code = 0;  // the exit status, or the signal number when signaled
  };

  static absl::StatusOr<std::unique_ptr<ScriptProcess>> Start(const ScriptCommand& command, Callbacks callbacks);
  ~ScriptProcess();

  // Tells the script to stop ("stop <reason>" on its control descriptor: run.should_stop()).
  void RequestStop(const std::string& reason);
  void Signal(int signal);
  // Waits for the process and for its pipes to drain.
  Exit Wait();
  // The last lines of its stderr (at most ~4 KiB), for a failure's reason.
  std::string StderrTail() const;
  // The script's memory as its meter shows it now (zeros when nothing wrote it). Thread-safe.
  fitrun::contract::meter::MemoryReading Memory() const;
  pid_t pid() const { return pid_; }

 private:
  ScriptProcess() = default;
  void ReadLines(int fd, const std::function<void(const std::string&)>& on_line, bool keep_tail);
  absl::Time drain_deadline() const;

  pid_t pid_ = -1;
  int control_fd_ = -1;
  fitrun::contract::meter::MemoryMeter* meter_ = nullptr;  // mapped until destruction
  std::thread report_reader_;
  std::thread stdout_reader_;
  std::thread stderr_reader_;
  bool waited_ = false;
  Exit exit_;
  mutable absl::Mutex mu_;
  std::string stderr_tail_ ABSL_GUARDED_BY(mu_);
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_SCRIPT_SCRIPT_PROCESS_H_
