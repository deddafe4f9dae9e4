#include "worker/ddp/flat_all_reduce.h"

#include <ATen/ATen.h>

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/ddp/c10d_status.h"

namespace fitrun::worker {

absl::StatusOr<std::unique_ptr<FlatAllReduceSynchronizer>> FlatAllReduceSynchronizer::Create(
    c10::intrusive_ptr<c10d::ProcessGroup> group, const std::vector<at::Tensor>& parameters) {
  if (!group) return absl::InvalidArgumentError("no process group");
  std::vector<at::Tensor> trained;
  int64_t elements = 0;
  for (const at::Tensor& p : parameters) {
    if (!p.requires_grad()) continue;
    if (p.scalar_type() != at::kFloat) {
      return absl::UnimplementedError(absl::StrCat("all-reducing ", c10::toString(p.scalar_type()),
                                                   " gradients (only float32 is supported)"));
    }
    trained.push_back(p);
    elements += p.numel();
  }
  // On the parameters' device, like the reducer's buckets.
  at::Tensor flat = at::zeros({elements + 1}, at::TensorOptions().dtype(at::kFloat).device(
                                                  trained.empty() ? at::Device(at::kCPU) : trained.front().device()));
  auto synchronizer = std::unique_ptr<FlatAllReduceSynchronizer>(
      new FlatAllReduceSynchronizer(std::move(group), std::move(trained), flat));
  synchronizer->gradient_elements_ = elements;
  return synchronizer;
}

FlatAllReduceSynchronizer::FlatAllReduceSynchronizer(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                     std::vector<at::Tensor> parameters,
                                                     at::Tensor flat)
    : group_(std::move(group)), parameters_(std::move(parameters)), flat_(std::move(flat)) {}

absl::StatusOr<at::Tensor> FlatAllReduceSynchronizer::SynchronizeWithLoss(const at::Tensor& local_loss) {
  const absl::Time start = absl::Now();
  absl::StatusOr<at::Tensor> mean = AllReduce(local_loss);
  exposed_ += absl::Now() - start;
  return mean;
}

absl::StatusOr<at::Tensor> FlatAllReduceSynchronizer::AllReduce(const at::Tensor& local_loss) {
  try {
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (const at::Tensor& p : parameters_) {
      at::Tensor slot = flat_.narrow(0, offset, p.numel());
      // A parameter the step did not reach has no gradient yet; it still takes part (as zeros) so
      // that every rank's buffer has the same layout.
      if (p.grad().defined()) {
        slot.copy_(p.grad().reshape({-1}));
      } else {
        slot.zero_();
      }
      offset += p.numel();
    }
    flat_[gradient_elements_].copy_(local_loss);

    std::vector<at::Tensor> tensors = {flat_};
    group_->allreduce(tensors)->wait();
    flat_.div_(group_->getSize());

    offset = 0;
    for (at::Tensor& p : parameters_) {
      at::Tensor slot = flat_.narrow(0, offset, p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slot);
      } else {
        p.mutable_grad() = slot.clone();
      }
      offset += p.numel();
    }
    return flat_[gradient_elements_].clone();
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, "all-reducing gradients");
  }
}

}  // namespace fitrun::worker
