#include "worker/ddp/comm_hook.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/status/status.h"
#include "worker/ddp/compress_hooks.h"
#include "worker/ddp/powersgd_hook.h"

namespace fitrun::worker {

PendingReduction AllReduceHook::Start(const GradBucket& bucket) {
  std::vector<at::Tensor> tensors = {bucket.flat};
  const double world = group_->getSize();
  return PendingReduction({group_->allreduce(tensors)}, [flat = bucket.flat, world] { flat.div_(world); });
}

absl::StatusOr<std::unique_ptr<CommHook>> CreateCommHook(const CommHookOptions& options,
                                                         c10::intrusive_ptr<c10d::ProcessGroup> group) {
  if (!group) return absl::InvalidArgumentError("no process group");
  switch (options.kind) {
    case CommHookOptions::Kind::kNone:
      return std::make_unique<AllReduceHook>(std::move(group));
    case CommHookOptions::Kind::kFp16:
      return std::make_unique<HalfCompressHook>(std::move(group), at::kHalf);
    case CommHookOptions::Kind::kBf16:
      return std::make_unique<HalfCompressHook>(std::move(group), at::kBFloat16);
    case CommHookOptions::Kind::kPowerSgd: {
      PowerSgdOptions powersgd;
      powersgd.matrix_approximation_rank = options.powersgd_rank;
      powersgd.start_powersgd_iter = options.powersgd_start_iter;
      absl::StatusOr<std::unique_ptr<PowerSgdHook>> hook = PowerSgdHook::Create(std::move(group), powersgd);
      if (!hook.ok()) return hook.status();
      return std::unique_ptr<CommHook>(std::move(*hook));
    }
  }
  return absl::InvalidArgumentError("spec.ddp.comm_hook: unknown hook");
}

}  // namespace fitrun::worker
