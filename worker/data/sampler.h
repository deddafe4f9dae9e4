#ifndef FITRUN_WORKER_DATA_SAMPLER_H_
#define FITRUN_WORKER_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace fitrun::worker {

// Splits each epoch's sample order between the ranks, as PyTorch's DistributedSampler does: one
// permutation per epoch seeded by (seed, epoch), and rank r takes positions r, r + W, r + 2W, ...
// Every rank gets exactly floor(N / W) indices, so ranks never disagree on how many steps an epoch
// has (an uneven share would leave one rank waiting in an all-reduce forever).
//
// With micro-batches taken in order from each rank's share, optimizer step s consumes exactly
// positions [s*G, (s+1)*G) of the permutation (G the global batch) whatever the split into devices,
// per-device batch and accumulation steps, so a re-planned job sees the same samples per step.
//
// The generator is std::mt19937_64 with a portable bounded draw, independent of torch and of the
// standard library's distributions, so the order is the same on every machine. Immutable; any thread.
class DistributedSampler {
 public:
  struct Options {
    int64_t dataset_size = 0;
    int world_size = 1;
    int rank = 0;
    uint64_t seed = 0;
  };

  static absl::StatusOr<DistributedSampler> Create(const Options& options);

  // This rank's share of epoch `epoch` (0-based), in the order it should be consumed.
  std::vector<int64_t> EpochIndices(int64_t epoch) const;

  // The whole epoch's permutation of [0, n), shared by all ranks.
  static std::vector<int64_t> Permutation(int64_t n, uint64_t seed, int64_t epoch);

  int64_t indices_per_rank() const { return options_.dataset_size / options_.world_size; }

 private:
  explicit DistributedSampler(const Options& options) : options_(options) {}

  Options options_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_SAMPLER_H_
