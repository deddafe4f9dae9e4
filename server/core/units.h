// Byte counts in words, for plans, reasons and errors a user reads.
#ifndef FITRUN_SERVER_CORE_UNITS_H_
#define FITRUN_SERVER_CORE_UNITS_H_

#include <cstdint>
#include <string>

namespace fitrun::server {

// "1.50 GiB", "512.0 MiB", "11.1 KiB", "64 B".
std::string FormatBytes(int64_t bytes);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_UNITS_H_
