#ifndef FITRUN_WORKER_DDP_COMPRESS_HOOKS_H_
#define FITRUN_WORKER_DDP_COMPRESS_HOOKS_H_

#include <string>

#include <c10/core/ScalarType.h>

#include "worker/ddp/comm_hook.h"

namespace fitrun::worker {

// PyTorch's fp16_compress_hook and bf16_compress_hook (ddp_comm_hooks/default_hooks.py): the
// bucket's gradients cast to the half type and divided by the world size before the all-reduce
// (so the sum cannot overflow), summed, and cast back into the bucket. The bucket's exact
// elements (the loss) go in a float32 all-reduce of their own beside it.
//
// Gloo in LibTorch 1.13 cannot reduce bfloat16 ("Invalid scalar type", on all_reduce and
// all_gather alike; PyTorch's own bf16_compress_hook fails the same way on Gloo), so off NCCL the
// bf16 hook sends the same bfloat16 values and does the sum itself, as NCCL's reduction does it:
// in float32, rounded to bfloat16. With up to 3 ranks it all-gathers the 2-byte values (as float16
// bits, which Gloo only copies) and adds them in rank order, the bytes of an fp16 all-reduce at 2
// ranks; with more ranks, where an all-gather would carry more than a float32 all-reduce, it
// widens them to float32 for the all-reduce. Either way every rank computes the same sum, and at
// 2 ranks it is exactly NCCL's bfloat16 all-reduce (one addition, rounded once).
class HalfCompressHook final : public CommHook {
 public:
  // `half` is at::kHalf or at::kBFloat16.
  HalfCompressHook(c10::intrusive_ptr<c10d::ProcessGroup> group, at::ScalarType half);
  PendingReduction Start(const GradBucket& bucket) override;
  std::string Describe() const override;

  // Up to this world size the Gloo bf16 path all-gathers; above it, it all-reduces in float32.
  static constexpr int kMaxAllGatherWorld = 3;

 private:
  const c10::intrusive_ptr<c10d::ProcessGroup> group_;
  const at::ScalarType half_;
  const bool native_;  // the backend reduces `half_` itself
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_COMPRESS_HOOKS_H_
