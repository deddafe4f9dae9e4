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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/ddp/shared_memory_all_reduce.h"

namespace fitrun::worker {
namespace {

// The rendezvous keys of the segment, beside the group's own in the job's store.
constexpr char kSegmentKey[] = "fitrun/shared_memory/segment";
constexpr char kTriedKey[] = "fitrun/shared_memory/tried";
constexpr char kOpenedKey[] = "fitrun/shared_memory/opened";

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

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

// Rank 0's segment for the group, or why this rank cannot use it; every rank publishes the outcome.
absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> JoinSegment(c10d::Store& store,
                                                                   const SharedMemoryAllReduce::Options& options) {
  if (options.rank == 0) {
    absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> created = SharedMemoryAllReduce::Create(options);
    // An empty value tells the peers there is nothing to open.
    store.set(kSegmentKey, Bytes(created.ok() ? absl::StrCat((*created)->name(), " ", (*created)->nonce()) : ""));
    return created;
  }
  const std::vector<uint8_t> value = store.get(kSegmentKey);
  const std::vector<std::string> parts = absl::StrSplit(std::string(value.begin(), value.end()), ' ');
  uint64_t nonce = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &nonce)) {
    return absl::UnavailableError("rank 0 has no shared-memory segment");
  }
  return SharedMemoryAllReduce::Open(parts[0], nonce, options);
}

}  // namespace

c10::intrusive_ptr<torch_compat::C10dBackend> WithSharedMemoryAllReduce(
    c10::intrusive_ptr<torch_compat::C10dBackend> fallback, const c10::intrusive_ptr<c10d::Store>& store, int rank,
    int world_size, absl::Duration timeout) {
  if (world_size < 2 || world_size > SharedMemoryAllReduce::kMaxRanks) return fallback;
  SharedMemoryAllReduce::Options options;
  options.rank = rank;
  options.world_size = world_size;
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>> segment = JoinSegment(*store, options);
  store->add(kOpenedKey, segment.ok() ? 1 : 0);
  int64_t tried = store->add(kTriedKey, 1);
  const absl::Time deadline = absl::Now() + timeout;
  while (tried < world_size && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    tried = store->add(kTriedKey, 0);
  }
  const bool everyone = tried == world_size && store->add(kOpenedKey, 0) == world_size;
  // Every rank has the segment mapped or never will: its name is no longer needed.
  if (segment.ok() && rank == 0) (*segment)->Unlink();
  if (!everyone || !segment.ok()) return fallback;
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
