// What a file written by torch.save({"name": tensor, ...}, path) holds, read without LibTorch:
// fitrund checks a tensors dataset at submit (keys, dtypes, shapes) from the archive's pickle alone.
//
// torch.save (PyTorch >= 1.6) writes a zip archive: <name>/data.pkl, a pickle (protocol 2) of the
// object in which each tensor is a call of torch._utils._rebuild_tensor_v2 on a persistent storage
// id ('storage', torch.<Type>Storage, key, location, numel), and <name>/data/<key>, each storage's
// raw bytes. The reader walks the zip's central directory (zip_archive.h), interprets the pickle's
// opcodes on a stack machine that builds plain values (it never resolves a global or calls anything,
// so a hostile file can describe, not do), and checks that each tensor's bytes are in the archive.
//
// Plain functions, thread-safe; the input is untrusted (bounded sizes, depth and counts).
#ifndef FITRUN_SERVER_CORE_SPECS_TENSOR_FILE_H_
#define FITRUN_SERVER_CORE_SPECS_TENSOR_FILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fitrun::server {

struct TensorInfo {
  // As PyTorch names it: "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16",
  // "int8", "uint8", "bool".
  std::string dtype;
  std::vector<int64_t> shape;

  bool floating() const;
  // Integer dtypes, bool excluded.
  bool integral() const;
  // "int64 [630, 128]"
  std::string Describe() const;
};

// The tensors of the dict at `path`, by key. INVALID_ARGUMENT, saying what was found, for anything
// else: not a zip (or the legacy format), a pickle that is not a dict of str -> tensor, a tensor
// whose bytes are missing. NOT_FOUND when the file cannot be opened.
absl::StatusOr<std::map<std::string, TensorInfo>> ReadTensorDict(const std::string& path);
// The same, from an open regular file's first `size` bytes (the descriptor stays the caller's).
absl::StatusOr<std::map<std::string, TensorInfo>> ReadTensorDict(int fd, uint64_t size);

// The same from the bytes of a whole file (for tests and the fuzzer).
absl::StatusOr<std::map<std::string, TensorInfo>> ParseTensorDict(absl::string_view file);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_TENSOR_FILE_H_
