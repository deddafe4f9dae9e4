// What a rank's process holds on its device beyond what its allocator hands out, which a plan must
// count besides the model's tensors.
//
// On a virtual CPU device: nothing. The capped allocator counts every byte the rank allocates and
// the cap binds exactly that, so the estimate is the allocator's peak.
//
// On a GPU, four things more (measured on an NVIDIA H100 80GB, CUDA 13, PyTorch 2.11; docs/gpu.md):
// - the CUDA context, 527 MiB per process before the first tensor;
// - the libraries' workspaces: cuBLAS takes about 210 MiB at its first matmul, 52 MiB of it inside
//   the caching allocator, so 158 MiB outside;
// - the collectives' buffers: NCCL holds about 560 MiB per rank outside the allocator, even at
//   world size 1 (Gloo over CUDA tensors about 70 MiB);
// - the caching allocator's reserve: it keeps segments it has freed, so what it holds at the peak
//   (reserved) exceeds what it hands out (allocated). Where memory is plentiful it holds 1.97-2.19x
//   for the cnn in fp32 with the default allocator, 1.14-1.22x with expandable segments, and at least
//   about 88 MiB however small the model (cuBLAS's 52 MiB and its smallest segments). Where memory
//   runs short it frees its cache and retries before it fails, so it needs less than it holds: the
//   largest batch that trains under a per-process cap reaches 93-98% of the cap in allocated bytes with
//   expandable segments, 73-89% with the default allocator.
// A GPU model no run has measured yet gets these figures 5% above (kUnmeasuredModelMargin): the
// context and libraries take more on another model (an H200's rank held 1,298 MiB outside its
// allocator, 4.3% above these 1,245 MiB; docs/gpu.md). Runs correct these defaults per GPU model and
// allocator setting (calibration/device_costs_book.h).
#ifndef FITRUN_SERVER_CORE_MEMORY_DEVICE_COSTS_H_
#define FITRUN_SERVER_CORE_MEMORY_DEVICE_COSTS_H_

#include <cstdint>
#include <string>

namespace fitrun::server {

struct DeviceCosts {
  int64_t context_bytes = 0;
  int64_t library_workspace_bytes = 0;
  int64_t communication_bytes = 0;
  // Reserved over allocated at the rank's peak where memory is plentiful, and the least the
  // allocator needs to train (under a cap it gives back its cache first), with the reserve it keeps
  // however small the model. 1, 1, 0: it holds nothing beyond what it hands out (a CPU device).
  double reserve_ratio = 1.0;
  double needed_ratio = 1.0;
  int64_t reserve_floor_bytes = 0;
  // A GPU slice: its cap binds the caching allocator only (the context, the libraries and NCCL lie
  // outside it), so the plan holds the allocator's bytes alone against the slice.
  bool capacity_binds_allocator_only = false;
  // The caching allocator's settings the ranks run with (PYTORCH_CUDA_ALLOC_CONF); empty on CPU.
  std::string allocator_config;
  // Where the figures come from, for the plan's reasons ("defaults measured on an H100", "runs on
  // NVIDIA H100 80GB HBM3").
  std::string source;

  bool any() const {
    return context_bytes > 0 || library_workspace_bytes > 0 || communication_bytes > 0 || reserve_ratio > 1.0 ||
           reserve_floor_bytes > 0;
  }
  int64_t outside_allocator_bytes() const { return context_bytes + library_workspace_bytes + communication_bytes; }
};

// How far above a measurement a plan takes it: what runs on a GPU model taught, held against the next
// run on that model (calibration/device_costs_book.h); and the figures above, measured on one H100,
// held against a model no run has measured.
inline constexpr double kCostsMargin = 1.03;
inline constexpr double kUnmeasuredModelMargin = 1.05;

// The caching allocator's setting ranks on GPUs run with unless fitrund's environment sets
// PYTORCH_CUDA_ALLOC_CONF: it lets a plan fill a GPU (93-98% of a cap instead of 73-89%).
inline constexpr char kDefaultCudaAllocatorConfig[] = "expandable_segments:True";

// A GPU's costs before any run on it corrected them: the figures above, kUnmeasuredModelMargin above.
// The reserve where memory is plentiful: 1.25x with expandable segments, 2.2x without, and at least
// 88 MiB (each as much above); what it needs: 1.08x and 1.37x, the inverse of the lowest share of a
// cap the largest trainable batch reached.
DeviceCosts DefaultCudaCosts(const std::string& allocator_config);

// What a rank's caching allocator handed out at its peak, as far as its whole footprint on the GPU
// (NVML's per-process figure) says: the footprint less what lies outside the allocator, over the
// reserve it keeps. The inverse of what a plan adds to the allocator's bytes, for a script that
// reports nothing of its own (its supervisor reads only the driver's figure); 0 when the footprint
// is all outside.
int64_t AllocatedFromFootprint(int64_t footprint_bytes, const DeviceCosts& costs);

// Whether a PYTORCH_CUDA_ALLOC_CONF value turns expandable segments on.
bool UsesExpandableSegments(const std::string& allocator_config);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_DEVICE_COSTS_H_
