#include "worker/ddp/c10d_optimizer_state_sharding.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/ddp/c10d_status.h"

namespace fitrun::worker {

absl::StatusOr<std::unique_ptr<C10dOptimizerStateSharding>> C10dOptimizerStateSharding::Create(
    c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<at::Tensor> parameters) {
  if (!group) return absl::InvalidArgumentError("optimizer state sharding needs a process group");
  if (parameters.empty()) return absl::InvalidArgumentError("optimizer state sharding needs parameters");
  for (const at::Tensor& p : parameters) {
    if (!p.is_contiguous()) {
      return absl::InvalidArgumentError("optimizer state sharding broadcasts parameters in place: they must be contiguous");
    }
  }
  const int rank = group->getRank();
  const int world_size = group->getSize();
  return std::unique_ptr<C10dOptimizerStateSharding>(
      new C10dOptimizerStateSharding(std::move(group), std::move(parameters), rank, world_size));
}

C10dOptimizerStateSharding::C10dOptimizerStateSharding(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                       std::vector<at::Tensor> parameters, int rank,
                                                       int world_size)
    : group_(std::move(group)), parameters_(std::move(parameters)), rank_(rank), world_size_(world_size) {
  std::vector<int64_t> element_counts;
  element_counts.reserve(parameters_.size());
  for (const at::Tensor& p : parameters_) element_counts.push_back(p.numel());
  owners_ = PartitionParameters(element_counts, world_size_);
}

absl::Status C10dOptimizerStateSharding::ShareSteppedParameters() {
  if (world_size_ == 1) return absl::OkStatus();
  try {
    at::NoGradGuard no_grad;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    works.reserve(parameters_.size());
    for (size_t i = 0; i < parameters_.size(); ++i) {
      // detach() shares the parameter's storage: the broadcast writes into the parameter itself.
      std::vector<at::Tensor> tensors = {parameters_[i].detach()};
      c10d::BroadcastOptions options;
      options.rootRank = owners_[i];
      works.push_back(group_->broadcast(tensors, options));
    }
    for (const auto& work : works) work->wait();
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, "sharing the stepped parameters from their owners");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> C10dOptimizerStateSharding::AllRanksSucceeded(bool ok) {
  if (world_size_ == 1) return ok;
  try {
    std::vector<at::Tensor> flag = {
        at::full({1}, ok ? 1 : 0, at::TensorOptions().dtype(at::kLong).device(parameters_.front().device()))};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MIN;
    group_->allreduce(flag, options)->wait();
    return flag[0].item<int64_t>() == 1;
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, "agreeing that every rank succeeded");
  }
}

}  // namespace fitrun::worker
