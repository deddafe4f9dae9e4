// absl::Time to and from the protos' Timestamp, for the times a job records (created, started,
// finished, each attempt's start and end).
#ifndef FITRUN_SERVER_CORE_JOBS_PROTO_TIME_H_
#define FITRUN_SERVER_CORE_JOBS_PROTO_TIME_H_

#include <google/protobuf/timestamp.pb.h>
#include <google/protobuf/util/time_util.h>

#include "absl/time/time.h"

namespace fitrun::server {

inline google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

inline absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixNanos(google::protobuf::util::TimeUtil::TimestampToNanoseconds(t));
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_PROTO_TIME_H_
