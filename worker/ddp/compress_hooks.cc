#include "worker/ddp/compress_hooks.h"

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace fitrun::worker {
namespace {

bool ReducesItself(const c10d::ProcessGroup& group) { return group.getBackendName() == "nccl"; }

}  // namespace

HalfCompressHook::HalfCompressHook(c10::intrusive_ptr<c10d::ProcessGroup> group, at::ScalarType half)
    : group_(std::move(group)),
      half_(half),
      transport_(ReducesItself(*group_) ? Transport::kAllReduce
                 : half == at::kHalf    ? (group_->getSize() == 2 ? Transport::kAllGather : Transport::kAllReduce)
                 : group_->getSize() <= kMaxAllGatherWorld ? Transport::kAllGather
                                                           : Transport::kWidenedAllReduce) {}

PendingReduction HalfCompressHook::Start(const GradBucket& bucket) {
  const int world = group_->getSize();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  at::Tensor compressed;             // the bucket in `half_`, divided by the world size
  std::vector<at::Tensor> gathered;  // every rank's `compressed`, as float16 bits
  at::Tensor widened;                // `compressed` in float32
  if (bucket.buffer.numel() > 0) {
    // default_hooks: bucket.buffer().to(dtype).div_(world_size). ATen divides float16 one element
    // at a time (in float32, rounded to float16); the same division over float32 vectors is the
    // same number, twice as fast. bfloat16's division is vectorized already.
    compressed = half_ == at::kHalf ? bucket.buffer.to(at::kHalf).to(at::kFloat).div_(world).to(at::kHalf)
                                    : bucket.buffer.to(half_).div_(world);
    switch (transport_) {
      case Transport::kAllReduce: {
        std::vector<at::Tensor> tensors = {compressed};
        works.push_back(group_->allreduce(tensors));
        break;
      }
      case Transport::kAllGather: {
        std::vector<at::Tensor> inputs = {compressed.view(at::kHalf)};
        std::vector<std::vector<at::Tensor>> outputs(1);
        for (int r = 0; r < world; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
        gathered = outputs[0];
        works.push_back(group_->allgather(outputs, inputs));
        break;
      }
      case Transport::kWidenedAllReduce: {
        widened = compressed.to(at::kFloat);
        std::vector<at::Tensor> tensors = {widened};
        works.push_back(group_->allreduce(tensors));
        break;
      }
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
  const std::string name = half_ == at::kHalf ? "fp16" : "bf16";
  switch (transport_) {
    case Transport::kAllReduce: return name;
    case Transport::kAllGather: return name + " (all-gathered, summed in float32)";
    case Transport::kWidenedAllReduce: return name + " (all-reduced as float32)";
  }
  return name;
}

}  // namespace fitrun::worker
