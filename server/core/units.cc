#include "server/core/units.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace fitrun::server {

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::abs(b) >= (1LL << 30)) return absl::StrFormat("%.2f GiB", b / (1LL << 30));
  if (std::abs(b) >= (1LL << 20)) return absl::StrFormat("%.1f MiB", b / (1LL << 20));
  if (std::abs(b) >= (1LL << 10)) return absl::StrFormat("%.1f KiB", b / (1LL << 10));
  return absl::StrCat(bytes, " B");
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  static const std::pair<const char*, int64_t> kUnits[] = {
      {"TiB", 1LL << 40}, {"GiB", 1LL << 30}, {"MiB", 1LL << 20}, {"KiB", 1LL << 10}, {"B", 1}};
  for (const auto& [suffix, scale] : kUnits) {
    absl::string_view number = text;
    if (!absl::ConsumeSuffix(&number, suffix)) continue;
    double value = 0;
    if (!absl::SimpleAtod(number, &value) || !(value > 0)) break;
    const double bytes = value * static_cast<double>(scale);
    if (!(bytes < 0x1p62)) return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large a size"));
    return static_cast<int64_t>(std::llround(bytes));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a size; write a positive number with B, KiB, MiB, GiB or TiB, e.g. 4GiB"));
}

}  // namespace fitrun::server
