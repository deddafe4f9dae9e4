#ifndef FITRUN_WORKER_DDP_C10D_STATUS_H_
#define FITRUN_WORKER_DDP_C10D_STATUS_H_

#include <exception>
#include <string>

#include "absl/status/status.h"

namespace fitrun::worker {

// c10d and Gloo report failures as exceptions; the worker's code speaks Status. The device's memory
// running out (worker/memory/oom_error.h) becomes ResourceExhausted, a timed-out wait
// DeadlineExceeded, anything else (peer gone, connection refused) Unavailable. `what` says which
// operation failed.
absl::Status StatusFromC10dException(const std::exception& e, const std::string& what);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_C10D_STATUS_H_
