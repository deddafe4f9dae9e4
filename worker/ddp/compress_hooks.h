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
// The sum is the half all-reduce's arithmetic (each addition in float32, rounded to the half
// type), carried by whatever Gloo does well:
//  - NCCL reduces both half types itself: a plain all-reduce, as PyTorch.
//  - Gloo in LibTorch 1.13 cannot reduce bfloat16 ("Invalid scalar type", on all_reduce and
//    all_gather alike; PyTorch's own bf16_compress_hook fails the same way on Gloo). Up to
//    kMaxAllGatherWorld ranks the hook all-gathers the 2-byte values (as float16 bits, which Gloo
//    only copies) and adds them in float32 in rank order, rounding once: at 2 ranks exactly NCCL's
//    bfloat16 all-reduce (one addition, one rounding), with the bytes of an fp16 all-reduce. With
//    more ranks, where an all-gather would carry more than a float32 all-reduce, it widens the
//    values to float32 for the all-reduce and rounds the sum.
//  - Gloo reduces float16 one element at a time with conversions (about 4x a float32 all-reduce of
//    twice the bytes, on loopback), so at 2 ranks the fp16 hook all-gathers too: one float32
//    addition rounded to float16 is what Gloo computes, bit for bit. At 3 ranks and more Gloo's ring
//    rounds after every addition, so the hook lets Gloo reduce, as PyTorch.
// Every rank computes the same sum either way.
class HalfCompressHook final : public CommHook {
 public:
  // `half` is at::kHalf or at::kBFloat16.
  HalfCompressHook(c10::intrusive_ptr<c10d::ProcessGroup> group, at::ScalarType half);
  PendingReduction Start(const GradBucket& bucket) override;
  std::string Describe() const override;

  // Up to this world size the Gloo bf16 path all-gathers; above it, it all-reduces in float32.
  static constexpr int kMaxAllGatherWorld = 3;

 private:
  // How the half values travel and get summed.
  enum class Transport { kAllReduce, kAllGather, kWidenedAllReduce };

  const c10::intrusive_ptr<c10d::ProcessGroup> group_;
  const at::ScalarType half_;
  const Transport transport_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_COMPRESS_HOOKS_H_
