// absl::Status <-> grpc::Status, the only place the two meet, with the error's reason and field.
#ifndef FITRUN_SERVER_SERVICE_GRPC_STATUS_H_
#define FITRUN_SERVER_SERVICE_GRPC_STATUS_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "server/core/errors.h"

namespace fitrun::server {

// The machine-readable reason a status carries (set with WithReason where an error starts), or one
// derived from its code; and the one field its message names first ("spec.data.path: ..."), if any.
inline std::string ErrorReason(const absl::Status& status) {
  if (absl::optional<absl::Cord> reason = status.GetPayload(kReasonPayload); reason.has_value()) {
    return std::string(*reason);
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return absl::StartsWith(status.message(), "spec") ? "INVALID_SPEC_FIELD" : "INVALID_REQUEST";
    case absl::StatusCode::kNotFound: return "JOB_NOT_FOUND";
    case absl::StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    case absl::StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case absl::StatusCode::kUnavailable: return "UNAVAILABLE";
    default: return "INTERNAL";
  }
}

inline std::string ErrorField(const absl::Status& status) {
  const absl::string_view message = status.message();
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos) return "";
  const absl::string_view field = message.substr(0, colon);
  return field.find(' ') == absl::string_view::npos ? std::string(field) : "";
}

// Adds the status's reason and field to the call's trailing metadata (fitrun-error-reason,
// fitrun-error-field), as the API documents.
inline void AddErrorDetails(grpc::ServerContextBase* context, const absl::Status& status) {
  if (status.ok()) return;
  context->AddTrailingMetadata("fitrun-error-reason", ErrorReason(status));
  if (std::string field = ErrorField(status); !field.empty()) context->AddTrailingMetadata("fitrun-error-field", field);
}

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl's canonical codes share gRPC's numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_GRPC_STATUS_H_
