#include "server/core/memory/device_costs.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fitrun::server {

bool UsesExpandableSegments(const std::string& allocator_config) {
  // "key:value,key:value", as PyTorch parses it; the last setting of a key wins.
  bool expandable = false;
  for (absl::string_view option : absl::StrSplit(allocator_config, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(option, absl::MaxSplits(':', 1));
    if (absl::StripAsciiWhitespace(kv.first) == "expandable_segments") {
      expandable = absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(kv.second), "true");
    }
  }
  return expandable;
}

int64_t AllocatedFromFootprint(int64_t footprint_bytes, const DeviceCosts& costs) {
  const int64_t reserved = std::max<int64_t>(
      0, footprint_bytes - costs.outside_allocator_bytes());
  if (reserved <= costs.reserve_floor_bytes) return reserved;
  return static_cast<int64_t>(static_cast<double>(reserved) / std::max(1.0, costs.reserve_ratio));
}

DeviceCosts DefaultCudaCosts(const std::string& allocator_config) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  const auto above = [](int64_t bytes) {
    return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) * kUnmeasuredModelMargin));
  };
  DeviceCosts costs;
  costs.context_bytes = above(527 * kMiB);
  costs.library_workspace_bytes = above(158 * kMiB);
  costs.communication_bytes = above(560 * kMiB);
  const bool expandable = UsesExpandableSegments(allocator_config);
  costs.reserve_ratio = (expandable ? 1.25 : 2.2) * kUnmeasuredModelMargin;
  costs.needed_ratio = expandable ? 1.08 : 1.37;
  costs.reserve_floor_bytes = above(88 * kMiB);
  costs.allocator_config = allocator_config;
  costs.source = absl::StrCat("figures measured on an H100 (context 527 MiB, cuBLAS 158 MiB outside the allocator, "
                              "NCCL 560 MiB; the allocator's reserve ",
                              expandable ? "1.25x with expandable segments" : "2.2x with the default allocator",
                              ", at least 88 MiB), each 5% above; runs on this GPU model correct them");
  return costs;
}

}  // namespace fitrun::server
