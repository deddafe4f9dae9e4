#ifndef FITRUN_WORKER_DATA_IDX_H_
#define FITRUN_WORKER_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fitrun::worker {

// The payload of an IDX file (the MNIST family's format): its dimensions and its unsigned bytes.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads a gzip-compressed (or plain) IDX file of unsigned bytes with `expected_dims` dimensions.
// Every problem (missing file, bad magic, truncated payload, trailing bytes) is an error naming the
// file, so a wrong spec.data.path is caught before training starts.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, int expected_dims);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_IDX_H_
