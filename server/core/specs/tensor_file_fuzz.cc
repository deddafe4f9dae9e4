// Fuzz target: a client's torch.save file through fitrund's zip and pickle reader.
#include <cstddef>
#include <cstdint>

#include "server/core/specs/tensor_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)fitrun::server::ParseTensorDict(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
