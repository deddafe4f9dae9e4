// The memory estimator: how many bytes one rank needs at its peak for a given per-device batch.
//
// peak(b) = weights + gradients + optimizer state + DDP bucket buffers + activations(b) + workspace
//           + framework overhead, then a safety margin on top. Plain arithmetic, no I/O: the planner
// calls it many times per plan.
//
// Two sources for the figures. Analytic profiles (model_profile.h) count tensors by formula and add
// fixed overheads and a 10% margin. Calibrated profiles (memory_calibration.h) carry the peaks the
// probe measured (memory_curve.h): the total is the curve at the batch plus a small margin, and the
// breakdown splits it into weights, gradients, optimizer state and buckets (computed), activations
// (what the curve adds over its batch-independent part) and framework overhead (the rest).
#ifndef FITRUN_SERVER_CORE_MEMORY_ESTIMATOR_H_
#define FITRUN_SERVER_CORE_MEMORY_ESTIMATOR_H_

#include <cstdint>

#include "fitrun/v1/job.pb.h"
#include "server/core/memory/device_costs.h"
#include "server/core/memory/model_profile.h"

namespace fitrun::server {

struct EstimatorOptions {
  // Fixed cost of the LibTorch runtime inside a rank's memory budget (allocator caches, kernels'
  // scratch). On a CPU device this is what the capped allocator sees beyond tensors.
  int64_t framework_overhead_bytes = 32LL << 20;
  // Scratch for matmul / conv kernels, proportional to the widest layer but bounded.
  int64_t workspace_bytes = 8LL << 20;
  // Added on top of the sum, as a fraction of it.
  double safety_margin = 0.10;
  // The margin for calibrated profiles: covers what the probe's single process does not see (the
  // real reducer's per-bucket buffers, the process group's scratch, measured at about 1%); the
  // curve between measured batches is already at most its tolerance above the truth.
  double calibrated_safety_margin = 0.03;
};

// Per-rank peak memory for `per_device_batch` samples per micro-batch: what the allocator hands out
// (weights to the margin), and on a GPU what the process holds beyond it (`costs`: the allocator's
// reserve, the CUDA context, the libraries' workspaces, the collectives' buffers), in total_bytes.
// With `optimizer_state_shards` ranks sharing the optimizer states (ZeRO stage 1), a rank keeps its
// share of them; a measured profile, taken from ranks that keep them all, is corrected by the rest.
fitrun::v1::MemoryBreakdown EstimateRankMemory(const ModelProfile& model, const fitrun::v1::JobSpec& spec,
                                               int64_t per_device_batch, const EstimatorOptions& options = {},
                                               const DeviceCosts& costs = {}, int optimizer_state_shards = 1);

// What a device's capacity is held against: on a CPU device the whole estimate; on a GPU what the
// caching allocator needs to train (it gives back its cache before it fails) and, unless the device
// is a slice whose cap binds the allocator only, the context, libraries and buffers outside it.
int64_t ChargedBytes(const fitrun::v1::MemoryBreakdown& predicted, const DeviceCosts& costs);

// The allocator's reserve as it will be on a device where it may hold at most `allocator_limit`
// bytes (a slice's cap, or a GPU's free memory less what lies outside the allocator): it keeps its
// cache only up to there. The total follows.
void FitReserveToLimit(fitrun::v1::MemoryBreakdown& predicted, int64_t allocator_limit);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_ESTIMATOR_H_
