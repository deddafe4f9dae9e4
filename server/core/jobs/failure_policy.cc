#include "server/core/jobs/failure_policy.h"

#include "absl/strings/str_cat.h"

namespace fitrun::server {

const char* FailureKindLabel(FailureKind kind) {
  switch (kind) {
    case FailureKind::kOutOfMemory: return "out_of_memory";
    case FailureKind::kHostOutOfMemory: return "host_out_of_memory";
    case FailureKind::kCrash: return "crash";
    case FailureKind::kHang: return "hang";
    case FailureKind::kBadConfig: return "bad_config";
  }
  return "crash";
}

FailureDecision DecideAfterFailure(fitrun::v1::Job& job, FailureKind kind, const FailureFacts& facts) {
  const fitrun::v1::FaultTolerance& tolerance = job.spec().fault_tolerance();
  std::string decision;
  bool retry = false;
  switch (kind) {
    case FailureKind::kOutOfMemory:
      if (job.spec().resources().per_device_batch() > 0) {
        decision = absl::StrCat("spec.resources.per_device_batch fixes the batch at ",
                                job.spec().resources().per_device_batch(),
                                ", so fitrun cannot choose a smaller one; remove it or set a smaller one");
      } else if (!job.oom_history().empty() && job.oom_history(job.oom_history_size() - 1).per_device_batch() == 1 &&
                 !facts.measuring_may_find_a_plan()) {
        decision = "even a per-device batch of 1 does not fit; devices with more memory, a smaller model or "
                   "spec.precision bf16 would";
      } else if (job.oom_replans() >= tolerance.max_oom_retries()) {
        decision = absl::StrCat("giving up after ", job.oom_replans(),
                                " re-plan(s) (spec.fault_tolerance.max_oom_retries ", tolerance.max_oom_retries(), ")");
      } else {
        job.set_oom_replans(job.oom_replans() + 1);
        retry = true;
        decision = absl::StrCat("re-planning with a smaller per-device batch and more accumulation (the same global "
                                "batch) and resuming from the last checkpoint (re-plan ",
                                job.oom_replans(), " of ", tolerance.max_oom_retries(), ")");
      }
      break;
    case FailureKind::kHostOutOfMemory: {
      const std::string& raise = facts.raise_host_memory_advice;
      if (job.spec().resources().per_device_batch() > 0) {
        decision = absl::StrCat("spec.resources.per_device_batch fixes the batch at ",
                                job.spec().resources().per_device_batch(),
                                ", so fitrun cannot try a smaller one; ", raise);
      } else if (facts.runs_on_gpus) {
        decision = absl::StrCat("on a GPU a rank's host memory does not shrink with its per-device batch; ", raise);
      } else if (!job.oom_history().empty() && job.oom_history(job.oom_history_size() - 1).per_device_batch() <= 1) {
        decision = absl::StrCat("even a per-device batch of 1 does not fit; ", raise);
      } else if (job.oom_replans() >= tolerance.max_oom_retries()) {
        decision = absl::StrCat("giving up after ", job.oom_replans(),
                                " re-plan(s) (spec.fault_tolerance.max_oom_retries ", tolerance.max_oom_retries(),
                                "); ", raise);
      } else {
        job.set_oom_replans(job.oom_replans() + 1);
        retry = true;
        decision = absl::StrCat("re-planning with a smaller per-device batch and more accumulation (the same global "
                                "batch) and resuming from the last checkpoint (re-plan ",
                                job.oom_replans(), " of ", tolerance.max_oom_retries(), "); should it recur, ", raise);
      }
      break;
    }
    case FailureKind::kCrash:
    case FailureKind::kHang:
      if (job.restarts() >= tolerance.max_restarts()) {
        decision = absl::StrCat("giving up after ", job.restarts(), " restart(s) (spec.fault_tolerance.max_restarts ",
                                tolerance.max_restarts(), ")");
      } else {
        job.set_restarts(job.restarts() + 1);
        retry = true;
        decision = absl::StrCat("restarting every rank from the last checkpoint (restart ", job.restarts(), " of ",
                                tolerance.max_restarts(), ")");
      }
      break;
    case FailureKind::kBadConfig:
      decision = "the worker refused the job's configuration, so trying again cannot help";
      break;
  }
  return FailureDecision{retry, decision};
}

}  // namespace fitrun::server
