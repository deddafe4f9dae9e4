#ifndef FITRUN_WORKER_DDP_BUCKETED_REDUCER_H_
#define FITRUN_WORKER_DDP_BUCKETED_REDUCER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/gradient_synchronizer.h"

namespace fitrun::worker {

// Gradient all-reduce overlapped with backward, as PyTorch's DistributedDataParallel reducer does it
// (torch/csrc/distributed/c10d/reducer.cpp), which cannot be included from Debian's headers:
//
//  - Parameters are assigned to buckets in reverse registration order (roughly the order backward
//    produces their gradients), the first bucket capped at first_bucket_cap_bytes so that
//    communication starts early, the others at bucket_cap_bytes. As PyTorch's
//    compute_bucket_assignment_by_size, a bucket closes once it reaches its cap, with the parameter
//    that took it there. Each bucket owns one flat buffer. PyTorch rebuilds its buckets after the
//    first step in the order the gradients were ready; for the built-in mlp and cnn that gives the
//    same buckets (the order within a bucket can differ, which no hook's numbers depend on: they
//    work per element or per parameter). The parity test compares the layouts.
//    (Splitting small models into more buckets, so that more of their all-reduce overlaps backward,
//    made the 2-rank mlp benchmark slower on this 2-core machine: the communication is CPU work on
//    cores that backward already fills, and mid-backward collectives wait on the scheduler.)
//  - Gradients are views into their bucket (DDP's gradient_as_bucket_view): every parameter's .grad
//    is its bucket slot from the start (a gradient it already had is copied in), so AccumulateGrad
//    adds into the bucket in place (the trainer's zero_grad keeps the tensors and zeroes them in place;
//    a gradient set to None is pointed at its slot again before backward), and no gradient is
//    copied into a bucket or back out of it, nor held beside it: pointing .grad at the slot only once
//    the first gradient arrived would keep a second copy of every gradient through the first step's
//    accumulation micro-batches, a peak the memory probe does not see. A post-hook on each
//    parameter's gradient accumulator (the AccumulateGrad node) marks the slot ready; whenever
//    something replaced .grad, it copies the gradient in and points .grad at the slot again. When the last slot of a bucket is ready, that bucket and every completed bucket after it in
//    launch order are all-reduced asynchronously; the process group runs the collective on its own
//    threads while backward continues.
//  - Buckets are launched strictly in index order, so every rank issues the same collectives in the
//    same order even when hooks fire in a different order on different ranks.
//  - What goes on the wire is the communication hook's (comm_hook.h: plain all-reduce, fp16 or bf16
//    compression, PowerSGD): the reducer hands it each bucket, in index order, when the bucket is
//    complete. SynchronizeWithLoss() launches what is left (parameters whose gradient backward did not
//    produce count as zeros) and waits for every bucket in index order, after which the hook has
//    left the means in the gradients. The step's loss rides in the last bucket's final element,
//    after the gradients, as an element hooks never compress: no extra collective for the plain
//    all-reduce and PowerSGD; the fp16 and bf16 hooks all-reduce it beside their half buffer.
//  - Backward passes of earlier micro-batches (BeforeBackward(false)) only accumulate locally, like
//    DDP's no_sync().
//
// Thread-safety: BeforeBackward/Synchronize belong to the training thread; the hooks run on whatever
// thread autograd uses (the caller's for CPU tensors) and take the mutex.
class BucketedReducer final : public GradientSynchronizer {
 public:
  struct Options {
    // spec.ddp.bucket_cap_mb; PyTorch's default.
    int64_t bucket_cap_bytes = 25 << 20;
    // PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES.
    int64_t first_bucket_cap_bytes = 1 << 20;
    // spec.ddp.comm_hook and its knobs.
    CommHookOptions comm_hook;
  };

  // Time the training thread spent on communication, for the exposed-communication share.
  struct CommStats {
    int64_t synchronized_steps = 0;
    // In the hooks' Start, from backward's gradient hooks and Synchronize: handing a bucket to Gloo's
    // or NCCL's thread (and a compressing hook's casts), or, through shared memory, the whole sum,
    // which runs on the training thread.
    absl::Duration start_time;
    absl::Duration wait_time;  // inside Synchronize, waiting for the buckets' all-reduce
    absl::Duration exposed() const { return start_time + wait_time; }
  };

  // `parameters` in registration order, the same on every rank; those that do not require gradients
  // are skipped. All must be float32 leaves on one device, where the buckets are then allocated: move
  // the model to its device before creating the reducer (moving it later would leave the buckets
  // and the hooks behind). INVALID_ARGUMENT for bad options, naming the spec field;
  // RESOURCE_EXHAUSTED when the buckets do not fit the device's memory.
  static absl::StatusOr<std::unique_ptr<BucketedReducer>> Create(
      c10::intrusive_ptr<c10d::ProcessGroup> group, const std::vector<at::Tensor>& parameters,
      const Options& options);
  // Removes the autograd hooks.
  ~BucketedReducer() override;

  // Also points every gradient that is not its bucket slot (set to None by a zero_grad, or replaced)
  // at the slot again, so that backward accumulates into the buckets in place.
  void BeforeBackward(bool last_micro_batch) override;
  // RESOURCE_EXHAUSTED when the device's memory ran out in a hook or a collective (worker/memory/
  // oom_error.h); otherwise as GradientSynchronizer says. The mean loss is a float32 copy of the
  // last bucket's loss element, on the buckets' device.
  absl::StatusOr<at::Tensor> SynchronizeWithLoss(const at::Tensor& local_loss) override;

  // Parameter indices (into the Create() list of trained parameters) of each bucket, in launch order.
  std::vector<std::vector<int>> BucketLayout() const;
  CommStats comm_stats() const;
  // comm_stats().exposed().
  absl::Duration ExposedCommunication() const override;
  // The communication hook, for logs ("none", "fp16", "powersgd (rank 1, ...)").
  std::string CommHookDescription() const;

 private:
  struct Bucket {
    at::Tensor flat;  // every slot, then (last bucket only) the loss
    std::vector<int> parameters;
    std::vector<int64_t> offsets;
    int pending = 0;
    GradBucket view;  // what the hook sees of `flat`
    PendingReduction reduction;  // started once every slot is ready
  };
  struct Slot {
    int bucket = 0;
    int64_t offset = 0;
    // The parameter-shaped window of the bucket that becomes its .grad. Not an autograd view (it
    // shares the bucket's storage directly), so the optimizer's zero_grad may detach_() it.
    at::Tensor grad_view;
    bool ready = false;
  };
  class ReadyHook;

  BucketedReducer(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<at::Tensor> parameters,
                  std::unique_ptr<CommHook> hook);

  // The AccumulateGrad post-hook of parameter `index`.
  void MarkReady(int index);
  // Launches, in index order, every bucket whose slots are all filled (the last one only when
  // `include_last`, since it carries the loss).
  void LaunchReadyBuckets(bool include_last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetForNextStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes parameter `index`'s .grad its bucket slot: copies a gradient held elsewhere in (or zeros
  // the slot when there is none) and points .grad at the slot.
  void MoveGradientIntoBucket(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const c10::intrusive_ptr<c10d::ProcessGroup> group_;
  const std::vector<at::Tensor> parameters_;
  const std::unique_ptr<CommHook> hook_ ABSL_PT_GUARDED_BY(mu_);
  // Kept alive: a parameter only holds a weak reference to its accumulator, and the hooks live on it.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  mutable absl::Mutex mu_;
  std::vector<Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  bool sync_this_backward_ ABSL_GUARDED_BY(mu_) = true;
  int next_bucket_ ABSL_GUARDED_BY(mu_) = 0;
  // The first exception a hook saw launching a collective; surfaced by Synchronize.
  std::exception_ptr hook_error_ ABSL_GUARDED_BY(mu_);
  CommStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_BUCKETED_REDUCER_H_
