// A SHA-256 digest, as lowercase hex: how the core names something large (a workload's whole spec)
// by a short key that cannot be forged to collide with another's.
#ifndef FITRUN_SERVER_CORE_DIGEST_H_
#define FITRUN_SERVER_CORE_DIGEST_H_

#include <string>

#include "absl/strings/string_view.h"

namespace fitrun::server {

std::string Sha256Hex(absl::string_view data);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_DIGEST_H_
