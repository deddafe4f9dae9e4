#include "worker/runtime/rank_runtime.h"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"

namespace fitrun::worker {
namespace {

// How long ago this process was forked, by the kernel's record (/proc/self/stat's starttime, in
// clock ticks since boot): the launcher's switch to the job's account, the exec and the loading of
// the binary's shared libraries all lie in it. Unset where /proc cannot say.
std::optional<absl::Duration> SinceFork() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the command's name may hold spaces and parentheses
  if (name_end == std::string::npos) return std::nullopt;
  const std::vector<std::string> fields = absl::StrSplit(stat.substr(name_end + 2), ' ');
  constexpr size_t kStartTime = 22 - 3;  // field 22 of stat(5), counted from field 3 (state)
  int64_t ticks = 0;
  timespec now{};
  if (fields.size() <= kStartTime || !absl::SimpleAtoi(fields[kStartTime], &ticks) ||
      clock_gettime(CLOCK_BOOTTIME, &now) != 0) {
    return std::nullopt;
  }
  return absl::DurationFromTimespec(now) - absl::Seconds(static_cast<double>(ticks) / sysconf(_SC_CLK_TCK));
}

}  // namespace

void StopSwitch::Stop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  stopped_ = true;
  reason_ = reason;
  if (request_stop_) request_stop_(reason);
  std::thread([grace = grace_] {
    absl::SleepFor(grace);
    contract::LogError("still running %s after the stop command; exiting", absl::FormatDuration(grace));
    std::_Exit(fitrun::contract::launch::kExitStopped);
  }).detach();
}

bool StopSwitch::Attach(std::function<void(const std::string& reason)> request_stop) {
  absl::MutexLock lock(&mu_);
  request_stop_ = std::move(request_stop);
  return !stopped_;
}

bool StopSwitch::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

bool StopSwitch::WaitForStop(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopped_), timeout);
  return stopped_;
}

std::string StopSwitch::reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

void MemoryStampingSink::OnProgress(const StepProgress& progress) {
  StepProgress stamped = progress;
  const MemoryFigures figures = measure_();
  stamped.live_bytes = figures.live_bytes;
  stamped.peak_bytes = figures.peak_bytes;
  stamped.reserved_peak_bytes = figures.reserved_peak_bytes;
  stamped.device_peak_bytes = std::max(device_peak_, figures.device_bytes);
  device_peak_ = stamped.device_peak_bytes;
  next_->OnProgress(stamped);
}

RankRuntime::RankRuntime(const WorkerOptions& options, Timing timing)
    : options_(options), timing_(timing), console_(options.rank, stderr), stop_(timing.stop_grace) {}

absl::Status RankRuntime::Start() {
  if (options_.coordinator.empty()) {
    sink_ = std::make_unique<TeeSink>(std::vector<ProgressSink*>{&console_});
    console_.OnLog("FITRUN_COORDINATOR not set: standalone, reports go to this log only");
    return absl::OkStatus();
  }
  GrpcReporter::Options reporter_options;
  reporter_options.coordinator = options_.coordinator;
  if (!options_.tls_ca.empty()) {
    std::ifstream in(options_.tls_ca);
    std::stringstream pem;
    pem << in.rdbuf();
    if (!in || pem.str().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(fitrun::contract::launch::kTlsCa, "=", options_.tls_ca, ": cannot read the CA"));
    }
    reporter_options.tls_ca_pem = pem.str();
  }
  reporter_options.job_id = options_.job_id;
  reporter_options.attempt = options_.attempt;
  reporter_options.rank = options_.rank;
  reporter_options.world_size = options_.world_size;
  reporter_options.job_token = options_.job_token;
  reporter_options.pid = static_cast<int>(getpid());
  absl::StatusOr<std::unique_ptr<GrpcReporter>> reporter =
      GrpcReporter::Create(reporter_options, [this](const std::string& reason) {
        console_.OnLog(absl::StrCat("stop command from the coordinator: ", reason));
        stop_.Stop(reason);
      });
  if (!reporter.ok()) return reporter.status();
  reporter_ = *std::move(reporter);
  sink_ = std::make_unique<TeeSink>(std::vector<ProgressSink*>{&console_, reporter_.get()});
  if (std::optional<absl::Time> taken = WarmIdentityTakenAt(); taken.has_value()) {
    sink_->OnLog(absl::StrFormat("warm rank: its job taken %.0f ms ago, %.1f s after its fork",
                                 absl::ToDoubleMilliseconds(absl::Now() - *taken),
                                 absl::ToDoubleSeconds(SinceFork().value_or(absl::ZeroDuration()))));
  } else if (std::optional<absl::Duration> up = SinceFork(); up.has_value()) {
    sink_->OnLog(absl::StrFormat("process up %.0f ms after its fork (account switch, exec, shared libraries)",
                                 absl::ToDoubleMilliseconds(*up)));
  }
  return absl::OkStatus();
}

ProgressSink* RankRuntime::coordinator() { return reporter_.get(); }

int RankRuntime::Finish(const fitrun::v1::RankFinished& finished, const std::string& summary) {
  console_.OnLog(summary);
  if (reporter_ != nullptr) {
    fitrun::v1::RankFinished report = finished;
    report.set_rank(options_.rank);
    reporter_->ReportFinished(report);
    reporter_->Shutdown(timing_.finish_timeout);
  }
  return fitrun::contract::launch::kExitSuccess;
}

int RankRuntime::Fail(ExitCode code, const absl::Status& status) {
  const std::string reason(status.message());
  contract::LogError("rank %d failed: %s", options_.rank, reason);
  if (reporter_ != nullptr) {
    reporter_->ReportFailed(reason);
    reporter_->Shutdown(timing_.fail_timeout);
  }
  return code;
}

int RankRuntime::OutOfMemory(fitrun::v1::OutOfMemory oom, const absl::Status& status) {
  oom.set_rank(options_.rank);
  console_.OnLog(absl::StrCat("out of memory at step ", oom.step(), ": requested ", oom.requested_bytes(),
                              " bytes with ", oom.live_bytes(), " live (peak ", oom.peak_bytes(), ") of a ",
                              oom.cap_bytes(), "-byte cap at per-device batch ", oom.per_device_batch()));
  if (reporter_ != nullptr) reporter_->ReportOutOfMemory(oom);
  return Fail(fitrun::contract::launch::kExitOutOfMemory, status);
}

int RankRuntime::Stopped() {
  return Fail(fitrun::contract::launch::kExitStopped,
              absl::CancelledError(absl::StrCat("stopped by the coordinator: ", stop_.reason())));
}

bool RankRuntime::StoppedMeanwhile() { return reporter_ != nullptr && stop_.WaitForStop(timing_.stop_race); }

int RunRank(const WorkerOptions& options, TrainingProgram& program) {
  // First thing: the token off its descriptor (which nothing this rank starts may inherit), this
  // process closed to the job's other processes.
  WorkerOptions with_token = options;
  if (absl::Status taken = TakeJobToken(with_token); !taken.ok()) {
    contract::LogError("rank %d: %s", options.rank, taken.message());
    return fitrun::contract::launch::kExitBadConfiguration;
  }
  RankRuntime runtime(with_token);
  if (absl::Status s = runtime.Start(); !s.ok()) {
    return runtime.Fail(fitrun::contract::launch::kExitBadConfiguration, s);
  }
  return program.Run(runtime);
}

}  // namespace fitrun::worker
