// Replacing a file whole: written beside it, flushed to disk and renamed over it, so a reader or a
// crash sees the old content or the new, never part of either.
#ifndef FITRUN_SERVER_CORE_ATOMIC_FILE_H_
#define FITRUN_SERVER_CORE_ATOMIC_FILE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace fitrun::server {

// Writes `content` to `path` with permissions `mode`; on an error nothing is left but the old file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content, mode_t mode = 0644);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_ATOMIC_FILE_H_
