#include "server/core/units.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fitrun::server {

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::abs(b) >= (1LL << 30)) return absl::StrFormat("%.2f GiB", b / (1LL << 30));
  if (std::abs(b) >= (1LL << 20)) return absl::StrFormat("%.1f MiB", b / (1LL << 20));
  if (std::abs(b) >= (1LL << 10)) return absl::StrFormat("%.1f KiB", b / (1LL << 10));
  return absl::StrCat(bytes, " B");
}

}  // namespace fitrun::server
