// Which GPUs fitrund offers, and how: --devices=cuda:0,cuda:1@8GiB,cuda:2@2GiBx2. A GPU is offered
// whole ("cuda:N") or as slices ("cuda:N@SIZE", "cuda:N@SIZExCOUNT"): a slice is a device of its own
// whose rank's caching allocator may reserve at most SIZE (the rank enforces it with the allocator's
// per-process limit), so operators can share a large GPU and tests can make a GPU tight. Several
// slices of one GPU are "cuda:N#0", "cuda:N#1", ...; their ranks talk over Gloo, since NCCL refuses
// two ranks on one GPU.
//
// Thread-safety: Snapshot may be called from any thread, as the GPU inventory it reads.
#ifndef FITRUN_SERVER_DEVICES_GPU_OFFER_H_
#define FITRUN_SERVER_DEVICES_GPU_OFFER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/device_inventory.h"

namespace fitrun::server {

// One GPU of the flag: its index, and its slices' size and count (0 and 1: the whole device).
struct GpuOfferItem {
  int index = 0;
  int64_t slice_bytes = 0;
  int count = 1;
};

// Whether a --devices value names GPUs ("cuda:..." or "gpu:...").
bool NamesGpus(absl::string_view flag);

// Parses the flag; INVALID_ARGUMENT naming the part that is wrong and what is accepted.
absl::StatusOr<std::vector<GpuOfferItem>> ParseGpuOffer(absl::string_view flag);

class GpuOffer : public DeviceInventory {
 public:
  // The offer over `gpus` (NVML's devices, "cuda:N"): INVALID_ARGUMENT at start-up for a GPU it does
  // not see, a GPU named twice, or slices more than the GPU holds.
  static absl::StatusOr<std::unique_ptr<GpuOffer>> Create(std::vector<GpuOfferItem> items,
                                                          std::unique_ptr<DeviceInventory> gpus);

  // The offered devices with fresh figures: a slice's total is its size and its free memory the GPU's
  // free memory, at most the slice.
  std::vector<fitrun::v1::Device> Snapshot() override;

 private:
  GpuOffer(std::vector<GpuOfferItem> items, std::unique_ptr<DeviceInventory> gpus)
      : items_(std::move(items)), gpus_(std::move(gpus)) {}
  const std::vector<GpuOfferItem> items_;
  const std::unique_ptr<DeviceInventory> gpus_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_DEVICES_GPU_OFFER_H_
