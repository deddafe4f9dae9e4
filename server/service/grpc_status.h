// absl::Status <-> grpc::Status, the only place the two meet.
#ifndef FITRUN_SERVER_SERVICE_GRPC_STATUS_H_
#define FITRUN_SERVER_SERVICE_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace fitrun::server {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl's canonical codes share gRPC's numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SERVICE_GRPC_STATUS_H_
