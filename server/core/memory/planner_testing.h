// What the planner's tests share: an mlp spec, its analytic profile, and CPU devices of one size.
#ifndef FITRUN_SERVER_CORE_MEMORY_PLANNER_TESTING_H_
#define FITRUN_SERVER_CORE_MEMORY_PLANNER_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/memory/planner.h"
#include "server/core/specs/test_specs.h"
#include "server/core/specs/workloads.h"

namespace fitrun::server {

inline constexpr int64_t kMiB = 1LL << 20;

inline fitrun::v1::JobSpec MlpSpec(int64_t global_batch, int min_devices, int max_devices) {
  return MlpTestSpec(global_batch, min_devices, max_devices);
}

inline ModelProfile Profile(const fitrun::v1::JobSpec& spec) { return *ProfileFor(spec); }

inline std::vector<DeviceCapacity> Devices(int n, int64_t bytes) {
  std::vector<DeviceCapacity> out;
  for (int i = 0; i < n; ++i) out.push_back({"cpu:" + std::to_string(i), bytes});
  return out;
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_PLANNER_TESTING_H_
