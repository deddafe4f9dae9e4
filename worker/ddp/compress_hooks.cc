#include "worker/ddp/compress_hooks.h"

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace fitrun::worker {

HalfCompressHook::HalfCompressHook(c10::intrusive_ptr<c10d::ProcessGroup> group, at::ScalarType half)
    : group_(std::move(group)), half_(half), native_(half == at::kHalf || group_->getBackendName() == "nccl") {}

PendingReduction HalfCompressHook::Start(const GradBucket& bucket) {
  const int world = group_->getSize();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  at::Tensor compressed;            // the bucket in `half_`, divided by the world size
  std::vector<at::Tensor> gathered;  // every rank's `compressed`, as float16 bits (Gloo bf16, few ranks)
  at::Tensor widened;                // `compressed` in float32 (Gloo bf16, many ranks)
  if (bucket.buffer.numel() > 0) {
    // default_hooks: bucket.buffer().to(dtype).div_(world_size), then the all-reduce.
    compressed = bucket.buffer.to(half_).div_(world);
    if (native_) {
      std::vector<at::Tensor> tensors = {compressed};
      works.push_back(group_->allreduce(tensors));
    } else if (world <= kMaxAllGatherWorld) {
      std::vector<at::Tensor> inputs = {compressed.view(at::kHalf)};
      std::vector<std::vector<at::Tensor>> outputs(1);
      for (int r = 0; r < world; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
      gathered = outputs[0];
      works.push_back(group_->allgather(outputs, inputs));
    } else {
      widened = compressed.to(at::kFloat);
      std::vector<at::Tensor> tensors = {widened};
      works.push_back(group_->allreduce(tensors));
    }
  }
  if (bucket.exact.numel() > 0) {
    std::vector<at::Tensor> tensors = {bucket.exact};
    works.push_back(group_->allreduce(tensors));
  }
  return PendingReduction(std::move(works), [bucket, world, half = half_, compressed, gathered, widened] {
    if (compressed.defined()) {
      if (!gathered.empty()) {
        at::Tensor sum = gathered[0].view(half).to(at::kFloat);
        for (size_t r = 1; r < gathered.size(); ++r) sum.add_(gathered[r].view(half).to(at::kFloat));
        bucket.buffer.copy_(sum.to(half));
      } else if (widened.defined()) {
        bucket.buffer.copy_(widened.to(half));
      } else {
        bucket.buffer.copy_(compressed);  // decompress in place, as PyTorch does
      }
    }
    if (bucket.exact.numel() > 0) bucket.exact.div_(world);
  });
}

std::string HalfCompressHook::Describe() const {
  if (half_ == at::kHalf) return "fp16";
  if (native_) return "bf16";
  return group_->getSize() <= kMaxAllGatherWorld ? "bf16 (all-gathered, summed in float32: Gloo has no bfloat16)"
                                                 : "bf16 (all-reduced as float32: Gloo has no bfloat16)";
}

}  // namespace fitrun::worker
