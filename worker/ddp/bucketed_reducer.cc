#include "worker/ddp/bucketed_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/ddp/c10d_status.h"
#include "worker/memory/oom_error.h"

namespace fitrun::worker {

// Runs after AccumulateGrad has updated the parameter's .grad, so with accumulation it sees the sum
// over the step's micro-batches, not just the last one's contribution.
class BucketedReducer::ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(BucketedReducer* reducer, int index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    reducer_->MarkReady(index_);
    return outputs;
  }

 private:
  BucketedReducer* reducer_;
  int index_;
};

absl::StatusOr<std::unique_ptr<BucketedReducer>> BucketedReducer::Create(
    c10::intrusive_ptr<c10d::ProcessGroup> group, const std::vector<at::Tensor>& parameters,
    const Options& options) {
  if (!group) return absl::InvalidArgumentError("no process group");
  if (options.bucket_cap_bytes <= 0 || options.first_bucket_cap_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.ddp.bucket_cap_mb: must be > 0 (got ",
                                                   options.bucket_cap_bytes, " bytes)"));
  }
  std::vector<at::Tensor> trained;
  for (const at::Tensor& p : parameters) {
    if (!p.requires_grad()) continue;
    if (p.scalar_type() != at::kFloat || !p.is_leaf()) {
      return absl::UnimplementedError(absl::StrCat("all-reducing a ", c10::toString(p.scalar_type()),
                                                   " parameter (only float32 leaves are supported)"));
    }
    if (!trained.empty() && p.device() != trained.front().device()) {
      return absl::UnimplementedError(absl::StrCat("parameters on ", trained.front().device().str(), " and ",
                                                   p.device().str(), " (one rank's model lives on one device)"));
    }
    trained.push_back(p);
  }
  absl::StatusOr<std::unique_ptr<CommHook>> hook = CreateCommHook(options.comm_hook, group);
  if (!hook.ok()) return hook.status();
  // The buckets live where the gradients are produced, so autograd accumulates into them on the
  // device and the collective (Gloo for CPU, NCCL for CUDA) reduces them in place.
  const at::TensorOptions bucket_options =
      at::TensorOptions().dtype(at::kFloat).device(trained.empty() ? at::Device(at::kCPU) : trained.front().device());
  auto reducer =
      std::unique_ptr<BucketedReducer>(new BucketedReducer(std::move(group), trained, *std::move(hook)));

  absl::MutexLock lock(&reducer->mu_);
  // Reverse registration order: the output layer's gradients are ready first. A bucket takes
  // parameters until it reaches its cap (PyTorch's compute_bucket_assignment_by_size).
  std::vector<Bucket>& buckets = reducer->buckets_;
  reducer->slots_.resize(trained.size());
  int64_t bucket_bytes = 0;
  bool bucket_full = true;
  for (int i = static_cast<int>(trained.size()) - 1; i >= 0; --i) {
    if (bucket_full) {
      buckets.emplace_back();
      bucket_bytes = 0;
      bucket_full = false;
    }
    Bucket& bucket = buckets.back();
    reducer->slots_[i] = {static_cast<int>(buckets.size()) - 1, bucket_bytes / 4, at::Tensor(), false};
    bucket.parameters.push_back(i);
    bucket.offsets.push_back(bucket_bytes / 4);
    bucket_bytes += trained[i].numel() * static_cast<int64_t>(sizeof(float));
    const int64_t cap = buckets.size() == 1 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
    bucket_full = bucket_bytes >= cap;
  }
  // A model without trained parameters still needs a bucket for the loss.
  if (buckets.empty()) buckets.emplace_back();
  int64_t bucket_elements = 1;  // the loss
  for (const at::Tensor& p : trained) bucket_elements += p.numel();
  // The buckets are the size of the gradients, allocated on the device now: on a full device this is
  // where a rank first runs out, which it must report as an OOM (ResourceExhausted), not a crash.
  try {
    for (size_t b = 0; b < buckets.size(); ++b) {
      int64_t elements = 0;
      for (int i : buckets[b].parameters) elements += trained[i].numel();
      if (b + 1 == buckets.size()) elements += 1;  // the loss
      buckets[b].flat = at::zeros({elements}, bucket_options);
      buckets[b].pending = static_cast<int>(buckets[b].parameters.size());
      const at::Tensor& flat = buckets[b].flat;
      const int64_t gradient_elements = b + 1 == buckets.size() ? elements - 1 : elements;
      GradBucket& view = buckets[b].view;
      view.index = static_cast<int>(b);
      view.is_last = b + 1 == buckets.size();
      view.flat = flat;
      view.buffer = flat.narrow(0, 0, gradient_elements);
      view.exact = flat.narrow(0, gradient_elements, elements - gradient_elements);
      for (size_t j = 0; j < buckets[b].parameters.size(); ++j) {
        const at::Tensor& p = trained[buckets[b].parameters[j]];
        reducer->slots_[buckets[b].parameters[j]].grad_view =
            at::empty({0}, flat.options())
                .set_(flat.storage(), flat.storage_offset() + buckets[b].offsets[j], p.sizes());
        view.gradients.push_back(view.buffer.narrow(0, buckets[b].offsets[j], p.numel()).view(p.sizes()));
      }
    }
    // Every gradient is its slot from the start (see the class comment).
    for (size_t i = 0; i < trained.size(); ++i) reducer->MoveGradientIntoBucket(static_cast<int>(i));
  } catch (const std::exception& e) {
    return StatusFromTorchException(
        e, absl::StrCat("allocating the gradient buckets (", bucket_elements * static_cast<int64_t>(sizeof(float)),
                        " bytes on ", bucket_options.device().str(), ")"));
  }

  try {
    for (size_t i = 0; i < trained.size(); ++i) {
      std::shared_ptr<torch::autograd::Node> accumulator =
          torch::autograd::impl::grad_accumulator(trained[i]);
      reducer->hook_keys_.push_back(accumulator->add_post_hook(
          std::make_unique<ReadyHook>(reducer.get(), static_cast<int>(i))));
      reducer->accumulators_.push_back(std::move(accumulator));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("registering gradient hooks: ", e.what()));
  }
  return reducer;
}

BucketedReducer::BucketedReducer(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                 std::vector<at::Tensor> parameters, std::unique_ptr<CommHook> hook)
    : group_(std::move(group)), parameters_(std::move(parameters)), hook_(std::move(hook)) {}

BucketedReducer::~BucketedReducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void BucketedReducer::BeforeBackward(bool last_micro_batch) {
  absl::MutexLock lock(&mu_);
  sync_this_backward_ = last_micro_batch;
  // A zero_grad that set the gradients to None (LibTorch 2.x's default) or code that replaced them
  // would have backward allocate each gradient anew beside its bucket, held through the step's
  // micro-batches; pointed at its slot again now, autograd accumulates into the bucket in place.
  try {
    for (size_t i = 0; i < parameters_.size(); ++i) MoveGradientIntoBucket(static_cast<int>(i));
  } catch (...) {
    if (!hook_error_) hook_error_ = std::current_exception();
  }
}

void BucketedReducer::MarkReady(int index) {
  absl::MutexLock lock(&mu_);
  if (!sync_this_backward_ || hook_error_) return;
  Slot& slot = slots_[index];
  Bucket& bucket = buckets_[slot.bucket];
  // A bucket already on the wire would be corrupted by a second write; that only happens when one
  // backward reaches a parameter twice through separate graphs, which the reducer does not support.
  if (bucket.reduction.started()) return;
  try {
    MoveGradientIntoBucket(index);
    if (!slot.ready) {
      slot.ready = true;
      --bucket.pending;
    }
    LaunchReadyBuckets(/*include_last=*/false);
  } catch (...) {
    hook_error_ = std::current_exception();
  }
}

void BucketedReducer::LaunchReadyBuckets(bool include_last) {
  const int last = static_cast<int>(buckets_.size()) - 1;
  while (next_bucket_ <= last && buckets_[next_bucket_].pending == 0 &&
         (include_last || next_bucket_ < last)) {
    Bucket& bucket = buckets_[next_bucket_];
    at::NoGradGuard no_grad;
    const absl::Time start = absl::Now();
    bucket.reduction = hook_->Start(bucket.view);
    stats_.start_time += absl::Now() - start;
    ++next_bucket_;
  }
}

absl::StatusOr<at::Tensor> BucketedReducer::SynchronizeWithLoss(const at::Tensor& local_loss) {
  absl::MutexLock lock(&mu_);
  try {
    if (hook_error_) std::rethrow_exception(std::exchange(hook_error_, nullptr));
    at::NoGradGuard no_grad;
    // Parameters backward did not reach (or every parameter, when the last backward ran without
    // hooks) take part with their current gradient or zeros, so every rank's buckets line up.
    for (size_t i = 0; i < parameters_.size(); ++i) {
      Slot& slot = slots_[i];
      if (slot.ready) continue;
      Bucket& bucket = buckets_[slot.bucket];
      MoveGradientIntoBucket(static_cast<int>(i));
      slot.ready = true;
      --bucket.pending;
    }
    Bucket& last = buckets_.back();
    // Rounded to float32 as the bucket holds it; copied on the device, so the host does not wait.
    last.flat[last.flat.numel() - 1].copy_(local_loss);
    LaunchReadyBuckets(/*include_last=*/true);

    // Every gradient is its bucket slot (MoveGradientIntoBucket ran for each this step), so the
    // hooks leave the means in the gradients. In index order: finishing a bucket may issue
    // collectives (PowerSGD's), which must line up across ranks.
    const absl::Time wait_start = absl::Now();
    for (Bucket& bucket : buckets_) bucket.reduction.Wait();
    stats_.wait_time += absl::Now() - wait_start;
    ++stats_.synchronized_steps;

    // A copy: the bucket is overwritten by the next step.
    at::Tensor loss = last.flat[last.flat.numel() - 1].clone();
    ResetForNextStep();
    return loss;
  } catch (const std::exception& e) {
    ResetForNextStep();
    return StatusFromC10dException(e, "all-reducing gradient buckets");
  }
}

void BucketedReducer::MoveGradientIntoBucket(int index) {
  at::Tensor& grad = const_cast<at::Tensor&>(parameters_[index]).mutable_grad();
  const at::Tensor& view = slots_[index].grad_view;
  if (grad.defined() && grad.data_ptr() == view.data_ptr()) return;
  at::NoGradGuard no_grad;
  if (grad.defined()) {
    view.copy_(grad);
  } else {
    view.zero_();
  }
  grad = view;
}

void BucketedReducer::ResetForNextStep() {
  for (Slot& slot : slots_) slot.ready = false;
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int>(bucket.parameters.size());
    bucket.reduction = PendingReduction();
  }
  next_bucket_ = 0;
  sync_this_backward_ = true;
}

std::vector<std::vector<int>> BucketedReducer::BucketLayout() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::vector<int>> layout;
  for (const Bucket& bucket : buckets_) layout.push_back(bucket.parameters);
  return layout;
}

std::string BucketedReducer::CommHookDescription() const {
  absl::MutexLock lock(&mu_);
  return hook_->Describe();
}

BucketedReducer::CommStats BucketedReducer::comm_stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Duration BucketedReducer::ExposedCommunication() const { return comm_stats().exposed(); }

}  // namespace fitrun::worker
