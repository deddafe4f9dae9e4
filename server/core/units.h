// Byte counts in words, for plans, reasons and errors a user reads, and sizes as people write them
// (flags such as --devices=cpu:2x4GiB, specs' spec.resources.host_memory).
#ifndef FITRUN_SERVER_CORE_UNITS_H_
#define FITRUN_SERVER_CORE_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fitrun::server {

// "1.50 GiB", "512.0 MiB", "11.1 KiB", "64 B".
std::string FormatBytes(int64_t bytes);

// "4GiB" -> 4294967296 (B, KiB, MiB, GiB, TiB; a fraction allowed: "1.5GiB"); INVALID_ARGUMENT
// naming the accepted units otherwise.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_UNITS_H_
