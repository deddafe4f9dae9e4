#include "worker/memory/oom_message.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace fitrun::worker {

int64_t RequestedBytesInOutOfMemory(const std::string& line) {
  // The capped CPU allocator: "tried to allocate 268435456 bytes".
  if (size_t at = line.find("tried to allocate "); at != std::string::npos) {
    absl::string_view rest = absl::string_view(line).substr(at + std::strlen("tried to allocate "));
    int64_t bytes = 0;
    const size_t space = rest.find(' ');
    if (space != absl::string_view::npos && absl::StartsWith(rest.substr(space), " bytes") &&
        absl::SimpleAtoi(rest.substr(0, space), &bytes)) {
      return bytes;
    }
  }
  // PyTorch's CUDA allocator: "Tried to allocate 256.00 MiB".
  if (size_t at = line.find("Tried to allocate "); at != std::string::npos) {
    absl::string_view rest = absl::string_view(line).substr(at + std::strlen("Tried to allocate "));
    const size_t space = rest.find(' ');
    double amount = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtod(rest.substr(0, space), &amount)) return 0;
    const absl::string_view unit = rest.substr(space + 1, 3);
    const double scale = unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1 << 10 : 1;
    return static_cast<int64_t>(amount * scale);
  }
  return 0;
}

bool LooksLikeOutOfMemory(const std::string& line) {
  return absl::StrContains(line, "OutOfMemoryError") || absl::StrContains(line, "CUDA out of memory") ||
         absl::StrContains(line, "memory cap exceeded") || absl::StrContains(line, "can't allocate memory") ||
         absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "MemoryError") ||
         // Allocations outside the caching allocator: the CUDA runtime's own (C10_CUDA_CHECK), as
         // NCCL words it, and cuBLAS's and cuDNN's handles and workspaces.
         absl::StrContains(line, "CUDA error: out of memory") || absl::StrContains(line, "Cuda failure 'out of memory'") ||
         absl::StrContains(line, "CUBLAS_STATUS_ALLOC_FAILED") || absl::StrContains(line, "CUDNN_STATUS_ALLOC_FAILED");
}

}  // namespace fitrun::worker
