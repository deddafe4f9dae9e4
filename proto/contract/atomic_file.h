// Replacing a file whole: written beside it, flushed to disk and renamed over it, so a reader or a
// crash sees the old content or the new, never part of either. fitrund writes its address files, the
// memory calibration and Slurm batch scripts so; ranks their decoded-dataset cache entries. Each
// writer has a temporary file of its own: ranks of one attempt write the same cache entry at the same
// time, and one shared temporary name would let one rank's bytes land in another's file.
#ifndef FITRUN_PROTO_CONTRACT_ATOMIC_FILE_H_
#define FITRUN_PROTO_CONTRACT_ATOMIC_FILE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fitrun::contract {

// Writes the concatenation of `pieces` to `path` with permissions `mode`, through a temporary
// "<path>.tmp-XXXXXX" in the same directory. On an error nothing is left but what `path` held before.
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const absl::string_view> pieces,
                                 mode_t mode = 0644);
inline absl::Status WriteFileAtomically(const std::string& path, absl::string_view content, mode_t mode = 0644) {
  return WriteFileAtomically(path, absl::Span<const absl::string_view>(&content, 1), mode);
}

}  // namespace fitrun::contract

#endif  // FITRUN_PROTO_CONTRACT_ATOMIC_FILE_H_
