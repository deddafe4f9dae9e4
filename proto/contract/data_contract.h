// How a tensors dataset (spec.data.kind: tensors) is read and split: fitrund plans epochs and checks
// the file at submit with these rules, and the worker loads it with the same ones.
#ifndef FITRUN_PROTO_CONTRACT_DATA_CONTRACT_H_
#define FITRUN_PROTO_CONTRACT_DATA_CONTRACT_H_

#include <cstdint>

namespace fitrun::contract::data {

// spec.data.target when the spec leaves it empty.
inline constexpr char kDefaultTargetKey[] = "target";
// spec.data.test_fraction when the spec leaves it unset.
inline constexpr double kDefaultTestFraction = 0.1;

// Of n samples, how many (the last ones) are the test split when no test_path is given.
inline int64_t TestSamples(int64_t n, double test_fraction) {
  return static_cast<int64_t>(static_cast<double>(n) * test_fraction);
}

}  // namespace fitrun::contract::data

#endif  // FITRUN_PROTO_CONTRACT_DATA_CONTRACT_H_
