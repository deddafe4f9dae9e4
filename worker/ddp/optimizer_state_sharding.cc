#include "worker/ddp/optimizer_state_sharding.h"

#include <algorithm>
#include <numeric>

namespace fitrun::worker {

std::vector<int> PartitionParameters(const std::vector<int64_t>& element_counts, int world_size) {
  std::vector<int> owners(element_counts.size(), 0);
  if (world_size <= 1) return owners;
  std::vector<size_t> order(element_counts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Stable: parameters of one size keep the model's order, so the owners are a function of the sizes.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return element_counts[a] > element_counts[b]; });
  std::vector<int64_t> held(world_size, 0);
  for (size_t i : order) {
    const int rank = static_cast<int>(std::min_element(held.begin(), held.end()) - held.begin());
    owners[i] = rank;
    held[rank] += element_counts[i];
  }
  return owners;
}

}  // namespace fitrun::worker
