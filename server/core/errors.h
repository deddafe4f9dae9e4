// How errors read: "spec.resources.max_devices: must be >= min_devices (got 1 < 2)", the field's
// path and what to do, as INVALID_ARGUMENT (one helper for every place that checks specs), and the
// reason a program can branch on.
#ifndef FITRUN_SERVER_CORE_ERRORS_H_
#define FITRUN_SERVER_CORE_ERRORS_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fitrun::server {

inline absl::Status FieldError(absl::string_view path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

// A machine-readable reason for an error, beside its code ("JOBS_PER_USER_LIMIT"), for clients to
// branch on; the service sends it as trailing metadata (server/service/grpc_status.h).
inline constexpr char kReasonPayload[] = "fitrun.v1/reason";

inline absl::Status WithReason(absl::Status status, absl::string_view reason) {
  status.SetPayload(kReasonPayload, absl::Cord(reason));
  return status;
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_ERRORS_H_
