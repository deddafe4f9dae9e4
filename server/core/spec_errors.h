// How a spec's errors read: "spec.resources.max_devices: must be >= min_devices (got 1 < 2)", the
// field's path and what to do, as INVALID_ARGUMENT. One helper for every place that checks specs.
#ifndef FITRUN_SERVER_CORE_SPEC_ERRORS_H_
#define FITRUN_SERVER_CORE_SPEC_ERRORS_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fitrun::server {

inline absl::Status FieldError(absl::string_view path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPEC_ERRORS_H_
