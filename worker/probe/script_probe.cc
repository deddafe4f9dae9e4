#include "worker/probe/script_probe.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "proto/contract/free_port.h"
#include "proto/contract/launch_contract.h"
#include "worker/options.h"

namespace fitrun::worker {
namespace launch = fitrun::contract::launch;

absl::StatusOr<PlanDevice> ScriptProbeDevice(const fitrun::v1::WorkerAssignment& assignment) {
  if (assignment.plan().device_ids_size() == 0) return PlanDevice{};
  return ParsePlanDevice(assignment.plan().device_ids(0), "plan.device_ids[0]");
}

ScriptRunSettings ScriptProbeRunSettings(const fitrun::v1::WorkerAssignment& assignment, const PlanDevice& device,
                                         int64_t batch) {
  ScriptRunSettings settings;
  settings.per_device_batch = batch;
  settings.grad_accum_steps = 1;
  settings.learning_rate = assignment.spec().optimizer().lr();
  settings.global_batch_size = batch;
  settings.max_steps = ScriptProbe::kSteps;
  settings.probe = true;
  settings.memory_cap_bytes = ProbeResourcesOf(assignment).memory_cap_bytes;
  const bool on_gpu = device.kind == PlanDevice::Kind::kCuda;
  settings.preload_allocator = !on_gpu;
  settings.extra_env = {{launch::kLocalRank, "0"},
                        {launch::kLocalWorldSize, "1"},
                        {launch::kMasterAddr, "127.0.0.1"},
                        {launch::kJobId, assignment.job_id().empty() ? "probe" : assignment.job_id()},
                        {launch::kAttempt, "0"},
                        {launch::kDeviceKind, on_gpu ? launch::kDeviceKindCuda : launch::kDeviceKindCpu}};
  if (on_gpu) settings.extra_env["CUDA_VISIBLE_DEVICES"] = absl::StrCat(device.index);
  return settings;
}

absl::StatusOr<std::unique_ptr<ScriptProbe>> ScriptProbe::Create(const fitrun::v1::WorkerAssignment& assignment) {
  return Create(assignment, FindSupportFiles());
}

absl::StatusOr<std::unique_ptr<ScriptProbe>> ScriptProbe::Create(const fitrun::v1::WorkerAssignment& assignment,
                                                                 SupportFiles support) {
  if (!assignment.spec().has_script()) return absl::InvalidArgumentError("spec.script: not a script job");
  absl::StatusOr<PlanDevice> device = ScriptProbeDevice(assignment);
  if (!device.ok()) return device.status();
  if (device->kind == PlanDevice::Kind::kCpu && support.memory_library.empty()) {
    return absl::FailedPreconditionError(
        "libfitrun_memory.so is not beside fitrun-worker: without it a script's memory cannot be counted");
  }
  if (device->kind == PlanDevice::Kind::kCuda && support.python_path.empty()) {
    return absl::FailedPreconditionError(
        "the fitrun Python module is not beside fitrun-worker: on a GPU it is what counts a script's memory");
  }
  // The command must resolve before anything runs.
  if (absl::StatusOr<ScriptCommand> command = ScriptCommandFor(assignment.spec(), ScriptRunSettings{}, support);
      !command.ok()) {
    return command.status();
  }
  return std::unique_ptr<ScriptProbe>(new ScriptProbe(assignment, *device, std::move(support)));
}

absl::StatusOr<ProbePeak> ScriptProbe::Measure(int64_t batch) {
  absl::StatusOr<int> port = contract::PickFreeLoopbackPort();
  if (!port.ok()) return port.status();
  ScriptRunSettings settings = ScriptProbeRunSettings(assignment_, device_, batch);
  // Every variable of the launch contract a rank gets, so a script runs in the probe as it runs in
  // its job: a checkpoint directory of its own (a scratch one, gone after the measurement), and the
  // job and attempt a script may name its files by.
  char scratch[] = "/tmp/fitrun-probe-checkpoints-XXXXXX";
  if (mkdtemp(scratch) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a scratch checkpoint directory: ", std::strerror(errno)));
  }
  settings.checkpoint_dir = scratch;
  struct RemoveScratch {
    std::string path;
    ~RemoveScratch() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } remove_scratch{scratch};
  settings.extra_env[launch::kMasterPort] = absl::StrCat(*port);
  absl::StatusOr<ScriptCommand> command = ScriptCommandFor(assignment_.spec(), settings, support_);
  if (!command.ok()) return command.status();
  // The probe's stdout is its answer to fitrund; the script's own output goes to stderr.
  command->stdout_to_stderr = true;

  std::atomic<bool> out_of_memory{false};
  ScriptProcess::Callbacks callbacks;
  callbacks.on_stderr_line = [&](const std::string& line) {
    if (LooksLikeOutOfMemory(line)) out_of_memory = true;
  };
  absl::StatusOr<std::unique_ptr<ScriptProcess>> process = ScriptProcess::Start(*command, callbacks);
  if (!process.ok()) return process.status();
  absl::Notification exited;
  bool timed_out = false;
  std::thread watchdog([&] {
    if (!exited.WaitForNotificationWithTimeout(kRunTimeout)) {
      timed_out = true;
      (*process)->Signal(SIGKILL);
    }
  });
  const ScriptProcess::Exit exit = (*process)->Wait();
  exited.Notify();
  watchdog.join();

  ProbePeak peak;
  peak.batch = batch;
  const fitrun::contract::meter::MemoryReading figures = (*process)->Memory();
  const bool have_peak = figures.writer != fitrun::contract::meter::kWriterNone;
  peak.peak_bytes = figures.peak_bytes;
  peak.other_peak_bytes = peak.peak_bytes;
  const std::string tail = (*process)->StderrTail();
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat("micro-batch ", batch, ": the script ran longer than ",
                                                    absl::FormatDuration(kRunTimeout), " for ", kSteps,
                                                    " steps (FITRUN_MAX_STEPS)"));
  }
  if (exit.signaled || exit.code != 0) {
    if (out_of_memory || (!exit.signaled && exit.code == launch::kExitOutOfMemory)) {
      return absl::ResourceExhaustedError(absl::StrCat("micro-batch ", batch, " ran out of the probe's ",
                                                       settings.memory_cap_bytes, "-byte budget"));
    }
    return absl::InternalError(absl::StrCat("the script at micro-batch ", batch, " ",
                                            exit.signaled ? "was killed by signal " : "exited with status ",
                                            exit.code, "; its stderr ended with:\n", tail));
  }
  if (!have_peak) {
    return absl::InternalError(absl::StrCat(
        "the script at micro-batch ", batch, " left no peak figure (did it end with os._exit?",
        device_.kind == PlanDevice::Kind::kCuda
            ? " On a GPU the fitrun module measures it: the script must import fitrun and call fitrun.init())"
            : ")"));
  }
  return peak;
}

absl::Status ProbeScript(const fitrun::v1::WorkerAssignment& assignment, const std::vector<int64_t>& batches) {
  absl::StatusOr<std::unique_ptr<ScriptProbe>> probe = ScriptProbe::Create(assignment);
  if (!probe.ok()) return probe.status();
  return MeasureAll(ProbeHeaderJson(0, 0), [&](int64_t batch) { return (*probe)->Measure(batch); }, batches);
}

}  // namespace fitrun::worker
