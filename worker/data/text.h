#ifndef FITRUN_WORKER_DATA_TEXT_H_
#define FITRUN_WORKER_DATA_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/tensor_dataset.h"

namespace fitrun::worker {

// A text file as byte-level language-model samples. The first 90% of the file's bytes (rounded
// down) is the training split, the rest the test split. Each split is cut into windows of
// context + 1 bytes with a stride of `context`, so every byte after a split's first is predicted
// exactly once per epoch; the sampler shuffles the windows. Window w of a split of n bytes covers
// [w * context, w * context + context], and there are floor((n - 1) / context) of them.
//
// The input holds each window's first `context` bytes and the targets its last `context` (the next byte of
// each position), both uint8 [windows, context]: twice the file in memory, no copies per step.

// Windows in one split of a file of `file_bytes`; the coordinator's planner uses the same numbers.
int64_t TextWindowCount(int64_t file_bytes, int64_t context, Split split);

// Reads `path` and returns one split's windows. InvalidArgument when the file cannot be read or a
// split has no whole window.
absl::StatusOr<TensorDataset> LoadTextWindows(const std::string& path, int64_t context, Split split);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_TEXT_H_
