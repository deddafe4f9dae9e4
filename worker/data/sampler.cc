#include "worker/data/sampler.h"

#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fitrun::worker {
namespace {

// Uniform in [0, bound) by rejection: std::uniform_int_distribution differs between standard
// libraries, and the order must not.
uint64_t Below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  while (true) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

absl::StatusOr<DistributedSampler> DistributedSampler::Create(const Options& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be >= 1 (got ", options.world_size, ")"));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [0, ", options.world_size, ") (got ", options.rank, ")"));
  }
  if (options.dataset_size < options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("dataset of ", options.dataset_size,
                                                   " samples cannot feed ", options.world_size, " ranks"));
  }
  return DistributedSampler(options);
}

std::vector<int64_t> DistributedSampler::Permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // seed_seq's mixing is specified by the standard, so (seed, epoch) maps to the same stream everywhere.
  const uint64_t e = static_cast<uint64_t>(epoch);
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32)};
  std::mt19937_64 rng(seq);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(order[i], order[Below(rng, static_cast<uint64_t>(i) + 1)]);
  }
  return order;
}

std::vector<int64_t> DistributedSampler::EpochIndices(int64_t epoch) const {
  const std::vector<int64_t> order = Permutation(options_.dataset_size, options_.seed, epoch);
  const int64_t per_rank = indices_per_rank();
  std::vector<int64_t> mine(per_rank);
  for (int64_t j = 0; j < per_rank; ++j) {
    mine[j] = order[options_.rank + j * options_.world_size];
  }
  return mine;
}

}  // namespace fitrun::worker
