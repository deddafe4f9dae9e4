#include "worker/ddp/shared_memory_backend.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/ddp/shared_memory_all_reduce.h"

namespace fitrun::worker {
namespace {

// The group's rendezvous store, as the segment's join uses it.
class StoreRendezvous final : public SharedMemoryAllReduce::Rendezvous {
 public:
  explicit StoreRendezvous(c10d::Store& store) : store_(store) {}
  void Set(const std::string& key, const std::string& value) override {
    store_.set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string Get(const std::string& key) override {
    const std::vector<uint8_t> value = store_.get(key);
    return std::string(value.begin(), value.end());
  }
  int64_t Add(const std::string& key, int64_t delta) override { return store_.add(key, delta); }

 private:
  c10d::Store& store_;
};

class SharedMemoryBackend final : public torch_compat::C10dBackend {
 public:
  SharedMemoryBackend(c10::intrusive_ptr<torch_compat::C10dBackend> fallback,
                      std::unique_ptr<SharedMemoryAllReduce> all_reduce)
      : torch_compat::C10dBackend(fallback->getRank(), fallback->getSize()),
        fallback_(std::move(fallback)),
        all_reduce_(std::move(all_reduce)) {}

  // The fp16 and bf16 hooks ask whether the group is NCCL's: it is still Gloo's.
  const std::string getBackendName() const override { return fallback_->getBackendName(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (!Carries(tensors, opts)) return fallback_->allreduce(tensors, opts);
    at::Tensor& t = tensors[0];
    absl::Status status;
    {
      absl::MutexLock lock(&mutex_);
      status = t.scalar_type() == at::kFloat ? all_reduce_->Sum(t.data_ptr<float>(), t.numel())
                                             : all_reduce_->Sum(t.data_ptr<double>(), t.numel());
    }
    // As Gloo's failed collectives do: the caller's wait (or its call, here) throws.
    if (!status.ok()) throw std::runtime_error(std::string(status.message()));
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    future->markCompleted(c10::IValue(tensors));
    return c10d::Work::create_from_future(future);
  }

  // The other collectives the worker issues, as they were.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return fallback_->broadcast(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return fallback_->allgather(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return fallback_->barrier(opts);
  }

 private:
  // One dense CPU float32 or float64 tensor, summed: what the gradient buckets and the loss are.
  static bool Carries(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
    if (tensors.size() != 1 || opts.reduceOp.op_ != c10d::ReduceOp::SUM) return false;
    const at::Tensor& t = tensors[0];
    return t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() &&
           (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
  }

  c10::intrusive_ptr<torch_compat::C10dBackend> fallback_;
  absl::Mutex mutex_;
  std::unique_ptr<SharedMemoryAllReduce> all_reduce_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace

c10::intrusive_ptr<torch_compat::C10dBackend> WithSharedMemoryAllReduce(
    c10::intrusive_ptr<torch_compat::C10dBackend> fallback, const c10::intrusive_ptr<c10d::Store>& store, int rank,
    int world_size, absl::Duration timeout) {
  if (world_size < 2 || world_size > SharedMemoryAllReduce::kMaxRanks) return fallback;
  SharedMemoryAllReduce::Options options;
  options.rank = rank;
  options.world_size = world_size;
  options.timeout = timeout;
  StoreRendezvous rendezvous(*store);
  absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> segment =
      SharedMemoryAllReduce::Join(rendezvous, "fitrun/shared_memory/", options);
  if (!segment.ok()) return fallback;
  return c10::make_intrusive<SharedMemoryBackend>(std::move(fallback), *std::move(segment));
}

bool SumsInSharedMemory(c10d::ProcessGroup& group) {
  try {
    return dynamic_cast<SharedMemoryBackend*>(torch_compat::BackendOf(group, c10::kCPU)) != nullptr;
  } catch (const std::exception&) {
    return false;  // 2.x: a group with no CPU backend (NCCL's)
  }
}

}  // namespace fitrun::worker
