// Which LibTorch exceptions mean that a device's memory ran out, so that every place a rank catches
// one reports it the same way: as ResourceExhausted, which the rank turns into its OutOfMemory report
// and exit code 3 (proto/contract/launch_contract.h), never as a crash. Header-only: a few lines
// that every LibTorch-facing library of the worker shares.
#ifndef FITRUN_WORKER_MEMORY_OOM_ERROR_H_
#define FITRUN_WORKER_MEMORY_OOM_ERROR_H_

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/memory/oom_message.h"

namespace fitrun::worker {

// c10::OutOfMemoryError (the CUDA caching allocator and the capped CPU allocator throw it), or an
// error whose text says the device's memory ran out without that type: a CUDA runtime or cuBLAS
// allocation that failed outside the caching allocator (the context, cuBLAS's workspace, NCCL's
// buffers), which LibTorch and c10d raise as plain c10::Errors.
inline bool IsOutOfMemory(const std::exception& e) {
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr || LooksLikeOutOfMemory(e.what());
}

// What an exception from LibTorch means for a rank: ResourceExhausted when the device's memory ran
// out, Internal otherwise; the message starts with `what` (the operation that failed).
inline absl::Status StatusFromTorchException(const std::exception& e, const std::string& what) {
  if (!IsOutOfMemory(e)) return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  // The size that failed is in the text (oom_message.h reads it back); LibTorch's backtrace is not
  // worth an OutOfMemory report's reason.
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return absl::ResourceExhaustedError(
      absl::StrCat(what, ": out of device memory: ", error != nullptr ? error->what_without_backtrace() : e.what()));
}

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MEMORY_OOM_ERROR_H_
