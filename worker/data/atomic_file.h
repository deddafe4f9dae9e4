// Replacing a file whole from a worker: written beside it, flushed to disk and renamed over it, so a
// reader or a crash sees the old content or the new, never part of either. The worker's copy of
// fitrund's server/core/atomic_file (the worker links no server code), with a temporary file of its
// own per writer: ranks of one attempt write the same decoded-dataset cache entry at the same time,
// and one shared temporary name would let one rank's bytes land in another's file.
#ifndef FITRUN_WORKER_DATA_ATOMIC_FILE_H_
#define FITRUN_WORKER_DATA_ATOMIC_FILE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fitrun::worker {

// Writes the concatenation of `pieces` to `path` with permissions `mode`, through a temporary
// "<path>.tmp-XXXXXX" in the same directory. On an error nothing is left but what `path` held before.
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const absl::string_view> pieces,
                                 mode_t mode = 0644);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_ATOMIC_FILE_H_
