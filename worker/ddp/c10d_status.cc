#include "worker/ddp/c10d_status.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/memory/oom_error.h"

namespace fitrun::worker {

absl::Status StatusFromC10dException(const std::exception& e, const std::string& what) {
  // A bucket, a compression buffer or NCCL's own buffers that did not fit: the device's memory, not
  // the collective, failed, and the rank reports an OOM for the coordinator to re-plan from.
  if (IsOutOfMemory(e)) return StatusFromTorchException(e, what);
  const std::string message = e.what();
  // c10d's store and Gloo's transport say "Timeout", "timed out" or "Timed out" in their messages.
  const std::string lower = absl::AsciiStrToLower(message);
  if (absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out")) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": ", message));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", message));
}

}  // namespace fitrun::worker
