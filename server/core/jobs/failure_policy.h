// What a failed attempt leads to: a re-plan with a smaller batch after an out-of-memory error, a
// restart of the group after a crash or a hang, or the job's end once its spec's limits are spent or
// trying again cannot help. A plain function of the job, what failed and a few facts fitrund knows
// about the attempt; the job manager acts on its answer (stops the ranks, changes the state).
#ifndef FITRUN_SERVER_CORE_JOBS_FAILURE_POLICY_H_
#define FITRUN_SERVER_CORE_JOBS_FAILURE_POLICY_H_

#include <functional>
#include <string>

#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

// What ended an attempt early, which decides whether and how the job is tried again.
enum class FailureKind {
  kOutOfMemory,  // re-plan with a smaller per-device batch (spec.fault_tolerance.max_oom_retries)
  // The attempt reached its host memory limit (spec.resources.host_memory) and the kernel's OOM
  // killer stopped a process: re-plan as for kOutOfMemory where a smaller batch needs less host
  // memory (CPU devices, the batch not fixed), otherwise fail naming the limit.
  kHostOutOfMemory,
  kCrash,      // restart the group as it was (spec.fault_tolerance.max_restarts)
  kHang,       // a rank went silent: restart the group (max_restarts)
  kBadConfig,  // the worker refused the job's configuration: trying again cannot help
};

// The reason label of fitrun_job_restarts_total.
const char* FailureKindLabel(FailureKind kind);

// What fitrund knows about the failed attempt beyond the job's record.
struct FailureFacts {
  // The attempt ran on GPUs (where a rank's host memory does not follow its batch).
  bool runs_on_gpus = false;
  // "raise spec.resources.host_memory (each rank may use 2.25 GiB now, the default)".
  std::string raise_host_memory_advice;
  // Whether measuring the workload may still find a plan below batch 1's analytic estimate (asked
  // only when an OOM struck at batch 1).
  std::function<bool()> measuring_may_find_a_plan = [] { return false; };
};

struct FailureDecision {
  bool retry = false;  // RESTARTING (re-planned on the next pass); otherwise FAILED
  std::string decision;  // what fitrund does, in words: the second half of the state change's reason
};

// The decision for `job` after a failure of `kind`; a retry counts against its limit in `job`
// (oom_replans or restarts).
FailureDecision DecideAfterFailure(fitrun::v1::Job& job, FailureKind kind, const FailureFacts& facts);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_FAILURE_POLICY_H_
