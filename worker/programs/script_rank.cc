#include "worker/programs/script_rank.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/contract/launch_contract.h"
#include "google/protobuf/util/json_util.h"
#include "worker/memory/process_gpu_memory.h"
#include "worker/script/script_process.h"

namespace fitrun::worker {
namespace {

constexpr ExitCode kTrainingFailed = fitrun::contract::launch::kExitTrainingFailed;
constexpr ExitCode kBadConfiguration = fitrun::contract::launch::kExitBadConfiguration;
// After a StopCommand the script has this long to notice run.should_stop() before SIGTERM; the
// runtime ends the rank for good at its own stop grace.
constexpr absl::Duration kScriptStopNotice = absl::Seconds(1);

// A script's own output goes to its watchers as torchrun shows it, up to this many lines a second
// per rank (and a burst of kOutputBurst): a script printing every step must not turn the job's event
// stream into its stdout. The rank's log keeps every line.
constexpr double kOutputLinesPerSecond = 20;
// How often a script's footprint on its GPU is read from NVML (a caching allocator's reserve only
// grows between frees, so little is missed).
constexpr absl::Duration kFootprintSampling = absl::Milliseconds(250);
constexpr double kOutputBurst = 100;

// Token bucket over the script's stdout lines; counts what it held back. Used by the stdout reader
// thread only.
class OutputForwarder {
 public:
  explicit OutputForwarder(ProgressSink* coordinator) : coordinator_(coordinator) {}

  void OnLine(const std::string& line) {
    if (coordinator_ == nullptr) return;
    const absl::Time now = absl::Now();
    tokens_ = std::min(kOutputBurst, tokens_ + absl::ToDoubleSeconds(now - last_) * kOutputLinesPerSecond);
    last_ = now;
    if (tokens_ < 1) {
      ++held_back_;
      return;
    }
    tokens_ -= 1;
    if (held_back_ > 0) {
      coordinator_->OnLog(absl::StrCat("(", held_back_, " lines of the script's output not shown; fitrun logs has them)"));
      held_back_ = 0;
    }
    coordinator_->OnLog(line);
  }

 private:
  ProgressSink* const coordinator_;
  double tokens_ = kOutputBurst;
  absl::Time last_ = absl::Now();
  int64_t held_back_ = 0;
};

class ScriptRank final : public TrainingProgram {
 public:
  explicit ScriptRank(const WorkerOptions& options) : options_(options) {}

  int Run(RankRuntime& runtime) override {
    runtime_ = &runtime;
    absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = LoadAssignment(options_.assignment_path);
    if (!assignment.ok()) return runtime.Fail(kBadConfiguration, assignment.status());
    if (absl::Status s = ValidateAssignment(*assignment, options_); !s.ok()) return runtime.Fail(kBadConfiguration, s);
    const fitrun::v1::Plan& plan = assignment->plan();
    absl::StatusOr<RankResources> resources = ResourcesOf(*assignment, options_.rank);
    if (!resources.ok()) return runtime.Fail(kBadConfiguration, resources.status());
    const PlanDevice& device = resources->device;

    ScriptRunSettings settings;
    settings.rank = options_.rank;
    settings.world_size = options_.world_size;
    settings.per_device_batch = plan.per_device_batch();
    settings.grad_accum_steps = plan.grad_accum_steps();
    settings.learning_rate = plan.learning_rate();
    settings.global_batch_size = assignment->spec().global_batch_size();
    settings.checkpoint_dir = assignment->checkpoint_dir();
    settings.max_steps = assignment->spec().max_steps();
    settings.zero_stage = plan.zero_stage();
    // A virtual CPU device's cap is enforced in the script by the preloaded allocator; a GPU slice's by
    // the fitrun module through torch.cuda's per-process limit (nothing is preloaded on a GPU: the
    // machine's PyTorch is not the LibTorch the allocator was built for); a whole GPU's own memory is
    // its limit.
    settings.memory_cap_bytes = resources->memory_cap_bytes;
    settings.preload_allocator = device.kind == PlanDevice::Kind::kCpu;
    // fitrun's placement wins over a CUDA_VISIBLE_DEVICES in spec.script.env, as every variable it sets
    // does (ScriptCommandFor): the plan, not the script, says which GPUs the job holds.
    if (std::optional<std::string> visible = ScriptCudaVisibleDevices(plan, options_.rank); visible.has_value()) {
      settings.extra_env["CUDA_VISIBLE_DEVICES"] = *visible;
    }
    settings.extra_env[fitrun::contract::launch::kDeviceKind] =
        device.kind == PlanDevice::Kind::kCuda ? fitrun::contract::launch::kDeviceKindCuda
                                               : fitrun::contract::launch::kDeviceKindCpu;
    settings.extra_env[fitrun::contract::launch::kLocalRank] = absl::StrCat(options_.local_rank);
    absl::StatusOr<ScriptCommand> command = ScriptCommandFor(assignment->spec(), settings, FindSupportFiles());
    if (!command.ok()) return runtime.Fail(kBadConfiguration, command.status());

    runtime.sink().OnLog(absl::StrCat("rank ", options_.rank, "/", options_.world_size, " on ",
                                      plan.device_ids(options_.rank), ": running ",
                                      absl::StrJoin(command->argv, " "), " in ", command->working_dir,
                                      ", per-device batch ", settings.per_device_batch, " x ",
                                      settings.grad_accum_steps, " accumulation, lr ", settings.learning_rate,
                                      settings.memory_cap_bytes > 0
                                          ? absl::StrCat(", memory cap ", settings.memory_cap_bytes, " bytes")
                                          : ""));
    ScriptProcess::Callbacks callbacks;
    callbacks.on_report_line = [this](const std::string& line) { OnReport(line); };
    OutputForwarder output(runtime.coordinator());
    callbacks.on_stdout_line = [&output](const std::string& line) { output.OnLine(line); };
    callbacks.on_stderr_line = [this](const std::string& line) {
      if (LooksLikeOutOfMemory(line)) {
        absl::MutexLock lock(&mu_);
        oom_on_stderr_ = true;
        if (const int64_t requested = RequestedBytesInOutOfMemory(line); requested > 0) oom_requested_ = requested;
      }
    };
    const absl::Time started = absl::Now();
    absl::StatusOr<std::unique_ptr<ScriptProcess>> process = ScriptProcess::Start(*command, callbacks);
    if (!process.ok()) return runtime.Fail(kTrainingFailed, process.status());
    // On a GPU the driver's per-process figure is the script's whole footprint there, the one
    // measurement of a script that reports nothing.
    std::unique_ptr<ProcessFootprintSampler> footprint = SampleFootprint(device, (*process)->pid());

    absl::Notification exited;
    std::thread terminator;
    const bool attached = runtime.stop().Attach([&](const std::string& reason) {
      (*process)->RequestStop(reason);
      terminator = std::thread([&] {
        if (!exited.WaitForNotificationWithTimeout(kScriptStopNotice)) (*process)->Signal(SIGTERM);
      });
    });
    if (!attached) (*process)->Signal(SIGTERM);
    const ScriptProcess::Exit exit = (*process)->Wait();
    exited.Notify();
    runtime.stop().Attach(nullptr);
    if (terminator.joinable()) terminator.join();
    fitrun::contract::meter::MemoryReading memory = (*process)->Memory();
    if (footprint != nullptr) {
      if (const int64_t process_peak = footprint->Stop(); process_peak > 0) memory.device_peak_bytes = process_peak;
    }
    return Ended(exit, (*process)->StderrTail(), settings, memory, absl::Now() - started);
  }

 private:
  // `ran` is the script's whole life (start-up, training, evaluation): a script does not say which
  // part was training.
  int Ended(const ScriptProcess::Exit& exit, const std::string& stderr_tail, const ScriptRunSettings& settings,
            const fitrun::contract::meter::MemoryReading& peak, absl::Duration ran) {
    RankRuntime& runtime = *runtime_;
    if (runtime.stop().stopped()) return runtime.Stopped();
    absl::MutexLock lock(&mu_);
    if (!exit.signaled && exit.code == fitrun::contract::launch::kExitSuccess) {
      fitrun::v1::RankFinished finished;
      finished.set_steps(last_step_);
      finished.set_final_loss(last_loss_);
      finished.set_train_seconds(absl::ToDoubleSeconds(ran));
      finished.set_peak_bytes(peak.peak_bytes);
      finished.set_reserved_peak_bytes(peak.reserved_peak_bytes);
      finished.set_device_peak_bytes(peak.device_peak_bytes);
      finished.mutable_metrics()->insert(last_metrics_.begin(), last_metrics_.end());
      return runtime.Finish(finished, absl::StrCat("the script finished after ", last_step_, " reported steps",
                                                   peak.peak_bytes > 0
                                                       ? absl::StrCat(", peak ", peak.peak_bytes, " bytes")
                                                       : ""));
    }
    const std::string how = exit.signaled ? absl::StrCat("was killed by signal ", exit.code)
                                          : absl::StrCat("exited with status ", exit.code);
    const std::string reason = absl::StrCat("the script ", how, "; its stderr ended with:\n", stderr_tail);
    if (oom_reported_ || oom_on_stderr_ || (!exit.signaled && exit.code == fitrun::contract::launch::kExitOutOfMemory)) {
      fitrun::v1::OutOfMemory oom = oom_;
      if (!oom_reported_) {
        // As the script saw it: the step it was in (after the last it reported; 0 before any) and
        // the request that failed, from the allocator that refused it or the error it printed.
        oom.set_step(last_step_ > 0 ? last_step_ + 1 : 0);
        oom.set_per_device_batch(settings.per_device_batch);
        oom.set_requested_bytes(peak.refused_bytes > 0 ? peak.refused_bytes : oom_requested_);
        oom.set_live_bytes(peak.refused_bytes > 0 ? peak.live_at_refusal : peak.live_bytes);
        oom.set_peak_bytes(peak.peak_bytes);
        oom.set_cap_bytes(settings.memory_cap_bytes);
      }
      return runtime.OutOfMemory(oom, absl::ResourceExhaustedError(reason));
    }
    if (!exit.signaled && exit.code == fitrun::contract::launch::kExitBadConfiguration) {
      return runtime.Fail(kBadConfiguration, absl::InvalidArgumentError(absl::StrCat(
                                                 reason, "(exit status 2: a usage or configuration error; "
                                                         "restarting cannot help)")));
    }
    return runtime.Fail(kTrainingFailed, absl::InternalError(reason));
  }

  // One JSON line from the fitrun module: a WorkerReport in protobuf's JSON mapping.
  void OnReport(const std::string& line) {
    fitrun::v1::WorkerReport report;
    if (const auto s = google::protobuf::util::JsonStringToMessage(line, &report); !s.ok()) {
      runtime_->sink().OnLog(absl::StrCat("a report from the script was not understood (", s.message().ToString(), "): ", line));
      return;
    }
    switch (report.report_case()) {
      case fitrun::v1::WorkerReport::kProgress: {
        const fitrun::v1::Progress& p = report.progress();
        StepProgress progress;
        progress.rank = options_.rank;
        progress.step = p.step();
        progress.total_steps = p.total_steps();
        progress.epoch = p.epoch();
        progress.loss = p.loss();
        progress.samples_per_second = p.samples_per_second();
        progress.live_bytes = p.live_bytes();
        progress.peak_bytes = p.peak_bytes();
        progress.metrics.insert(p.metrics().begin(), p.metrics().end());
        {
          absl::MutexLock lock(&mu_);
          last_step_ = p.step();
          last_loss_ = p.loss();
          // A script may report some figures only now and then (validation at an epoch's end).
          for (const auto& [name, value] : p.metrics()) last_metrics_[name] = value;
        }
        runtime_->sink().OnProgress(progress);
        break;
      }
      case fitrun::v1::WorkerReport::kLog:
        runtime_->sink().OnLog(report.log().text());
        break;
      case fitrun::v1::WorkerReport::kCheckpointSaved: {
        CheckpointNotice notice;
        notice.rank = options_.rank;
        notice.step = report.checkpoint_saved().step();
        notice.path = report.checkpoint_saved().path();
        notice.bytes = report.checkpoint_saved().bytes();
        runtime_->sink().OnCheckpoint(notice);
        break;
      }
      case fitrun::v1::WorkerReport::kOom: {
        absl::MutexLock lock(&mu_);
        oom_ = report.oom();
        oom_reported_ = true;
        break;
      }
      default:
        runtime_->sink().OnLog(absl::StrCat("a report the script may not send was ignored: ", line));
    }
  }

  // NVML's sampler of the script's footprint on its GPU; null on a CPU device or without NVML.
  std::unique_ptr<ProcessFootprintSampler> SampleFootprint(const PlanDevice& device, pid_t script) {
    if (device.kind != PlanDevice::Kind::kCuda) return nullptr;
    if (nvml_ == nullptr) {
      absl::StatusOr<std::unique_ptr<NvmlProcessMemory>> nvml = NvmlProcessMemory::Create({});
      if (!nvml.ok()) {
        runtime_->sink().OnLog(absl::StrCat("the script's footprint on its GPU is not sampled: ", nvml.status().message()));
        return nullptr;
      }
      nvml_ = *std::move(nvml);
    }
    return std::make_unique<ProcessFootprintSampler>(nvml_.get(), static_cast<unsigned int>(device.index), script,
                                                     kFootprintSampling);
  }

  const WorkerOptions options_;
  RankRuntime* runtime_ = nullptr;
  std::unique_ptr<NvmlProcessMemory> nvml_;
  absl::Mutex mu_;
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = 0;
  double last_loss_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, double> last_metrics_ ABSL_GUARDED_BY(mu_);
  bool oom_on_stderr_ ABSL_GUARDED_BY(mu_) = false;
  int64_t oom_requested_ ABSL_GUARDED_BY(mu_) = 0;  // from the error line the script printed
  bool oom_reported_ ABSL_GUARDED_BY(mu_) = false;
  fitrun::v1::OutOfMemory oom_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::optional<std::string> ScriptCudaVisibleDevices(const fitrun::v1::Plan& plan, int rank) {
  if (rank < 0 || rank >= plan.device_ids_size()) return std::nullopt;
  const std::string& own_id = plan.device_ids(rank);
  absl::StatusOr<PlanDevice> own = ParsePlanDevice(own_id, "plan.device_ids");
  if (!own.ok() || own->kind != PlanDevice::Kind::kCuda) return std::nullopt;
  if (own_id.find('/') != std::string::npos) return std::nullopt;
  const std::string alone = absl::StrCat(own->index);
  // The ranks on this machine, in rank order: on a single machine (no node prefix), all of them.
  std::vector<int> gpus;
  for (const std::string& id : plan.device_ids()) {
    if (id.find('/') != std::string::npos) continue;
    absl::StatusOr<PlanDevice> device = ParsePlanDevice(id, "plan.device_ids");
    if (!device.ok() || device->kind != PlanDevice::Kind::kCuda) return alone;
    // CUDA takes a GPU once: two ranks on one GPU cannot each be index LOCAL_RANK.
    if (std::find(gpus.begin(), gpus.end(), device->index) != gpus.end()) return alone;
    gpus.push_back(device->index);
  }
  return absl::StrJoin(gpus, ",");
}

std::unique_ptr<TrainingProgram> MakeScriptRank(const WorkerOptions& options) {
  return std::make_unique<ScriptRank>(options);
}

}  // namespace fitrun::worker
