#ifndef FITRUN_WORKER_DDP_NUMPY_RANDOM_H_
#define FITRUN_WORKER_DDP_NUMPY_RANDOM_H_

#include <cstdint>
#include <random>

namespace fitrun::worker {

// numpy.random.RandomState(seed) as far as PyTorch's PowerSGDState uses it: randint(high), which
// seeds the random projections, so fitrun's PowerSGD draws the same Q matrices as PyTorch's.
// The legacy RandomState is MT19937 seeded by init_genrand (which std::mt19937 implements), and
// its randint draws 32-bit outputs masked to the smallest all-ones mask covering high - 1,
// rejecting values above it (numpy's masked bounded integers, kept for backward compatibility).
//
// Thread-compatible: one owner.
class LegacyNumpyRandomState {
 public:
  explicit LegacyNumpyRandomState(uint32_t seed) : engine_(seed) {}

  // RandomState.randint(high) for 1 <= high <= 2^32: uniform in [0, high).
  int64_t RandInt(int64_t high) {
    const uint64_t range = static_cast<uint64_t>(high) - 1;
    if (range == 0) return 0;  // numpy draws nothing
    if (range == 0xFFFFFFFFu) return static_cast<int64_t>(engine_());
    uint64_t mask = range;
    for (int shift = 1; shift < 64; shift <<= 1) mask |= mask >> shift;
    uint64_t value;
    do {
      value = static_cast<uint64_t>(engine_()) & mask;
    } while (value > range);
    return static_cast<int64_t>(value);
  }

 private:
  std::mt19937 engine_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_NUMPY_RANDOM_H_
