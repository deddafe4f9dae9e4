#ifndef FITRUN_WORKER_DDP_COMM_HOOK_H_
#define FITRUN_WORKER_DDP_COMM_HOOK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/statusor.h"

namespace fitrun::worker {

// One gradient bucket as a communication hook sees it: PyTorch's dist.GradBucket, plus the elements
// that must be averaged exactly. `flat` is the bucket's one buffer: `buffer` (the flattened
// gradients, PyTorch's bucket.buffer()) followed by `exact` (in the last bucket the step's loss,
// which rides there at no extra collective; empty elsewhere). A hook may compress `buffer`, never
// `exact`. Tensors are views of the reducer's storage, valid for the reducer's lifetime.
struct GradBucket {
  int index = 0;
  bool is_last = false;  // PyTorch's bucket.is_last(): the step's last bucket
  at::Tensor flat;
  at::Tensor buffer;
  std::vector<at::Tensor> gradients;  // one parameter-shaped view of `buffer` each (bucket.gradients())
  at::Tensor exact;
};

// A bucket's reduction in flight: the collectives a hook started, and what turns their results
// into the mean over ranks. Wait() runs on the training thread.
class PendingReduction {
 public:
  PendingReduction() = default;
  PendingReduction(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> finish)
      : works_(std::move(works)), finish_(std::move(finish)), started_(true) {}

  // Waits for the collectives (each within the process group's timeout), then finishes: afterwards
  // the bucket holds the mean. Finishing may run collectives of its own (PowerSGD's second
  // all-reduce), which is why the reducer waits for buckets in index order on every rank. Throws
  // what c10d throws.
  void Wait() {
    for (auto& work : works_) work->wait();
    works_.clear();
    if (finish_) std::exchange(finish_, nullptr)();
  }
  bool started() const { return started_; }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::function<void()> finish_;
  bool started_ = false;
};

// How a bucket is all-reduced, as a DDP communication hook (torch.distributed.algorithms.
// ddp_comm_hooks): the reducer stays about bucketing and overlap, a hook about what goes on the
// wire. Start() is called once per bucket per synchronizing step, in bucket index order on every
// rank, each bucket's Start before any Wait of that step, so collectives line up across ranks.
// Every collective is issued from Start or Wait on the reducer's calling threads, never from a
// completion callback (PyTorch's powerSGD_hook issues its later all-reduces from Gloo's callback
// threads, which lets two buckets' collectives interleave differently on different ranks).
//
// Thread-safety: called under the reducer's lock; a hook need not lock itself.
class CommHook {
 public:
  virtual ~CommHook() = default;
  // Starts reducing `bucket` in place; throws what LibTorch and c10d throw.
  virtual PendingReduction Start(const GradBucket& bucket) = 0;
  // For logs: "fp16", "powersgd (rank 1, from step 11)".
  virtual std::string Describe() const = 0;
};

// spec.ddp.comm_hook and PowerSGD's knobs (PyTorch's PowerSGDState defaults).
struct CommHookOptions {
  enum class Kind { kNone, kFp16, kBf16, kPowerSgd };
  Kind kind = Kind::kNone;
  int powersgd_rank = 1;             // matrix_approximation_rank
  int64_t powersgd_start_iter = 1000;  // start_powerSGD_iter
};

// The plain hook: one fp32 all-reduce of the whole bucket, then the division by the world size.
class AllReduceHook final : public CommHook {
 public:
  explicit AllReduceHook(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {}
  PendingReduction Start(const GradBucket& bucket) override;
  std::string Describe() const override { return "none"; }

 private:
  const c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

// The hook `options` names, on `group`. INVALID_ARGUMENT naming the spec field for bad knobs.
absl::StatusOr<std::unique_ptr<CommHook>> CreateCommHook(const CommHookOptions& options,
                                                         c10::intrusive_ptr<c10d::ProcessGroup> group);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_COMM_HOOK_H_
