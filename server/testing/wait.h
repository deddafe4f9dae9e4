// What server tests wait on: a condition polled until it holds or a timeout passes (never a fixed sleep
// alone), and whether a process has ended.
#ifndef FITRUN_SERVER_TESTING_WAIT_H_
#define FITRUN_SERVER_TESTING_WAIT_H_

#include <sys/types.h>

#include <functional>

#include "absl/time/time.h"

namespace fitrun::server {

// Polls `condition` every 20 ms; true as soon as it holds, false once `timeout` has passed without.
bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(10));

// Whether process `pid` is gone, or a zombie nobody reaped yet (which runs nothing).
bool ProcessGone(pid_t pid);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_TESTING_WAIT_H_
