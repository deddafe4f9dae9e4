// Fuzz target: YAML from a client through the spec parser, the validator and the defaults.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/core/specs/job_specs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<fitrun::v1::JobSpec> spec =
      fitrun::server::ParseJobSpecYaml(std::string(reinterpret_cast<const char*>(data), size));
  if (spec.ok()) (void)fitrun::server::NormalizeJobSpec(*std::move(spec));
  return 0;
}
