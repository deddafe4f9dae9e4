// Whether a memory peak an attempt's ranks reported can be true. A rank's figures are its own word
// (the job's processes are its owner's): what fitrund measured itself bounds them before any plan
// learns from them.
#ifndef FITRUN_SERVER_CORE_JOBS_RUN_PEAKS_H_
#define FITRUN_SERVER_CORE_JOBS_RUN_PEAKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fitrun/v1/job.pb.h"
#include "server/core/jobs/job_entry.h"

namespace fitrun::server {

// Why `reported` (a rank's peak, in bytes) cannot be true of `attempt`: more than its devices have
// (`devices`: the inventory), or on CPU devices more than its cgroup saw its processes hold
// together; empty when it may be.
std::string ImpossiblePeak(const ActiveAttempt& attempt, const std::vector<fitrun::v1::Device>& devices,
                           int64_t reported);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_RUN_PEAKS_H_
