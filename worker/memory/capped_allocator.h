#ifndef FITRUN_WORKER_MEMORY_CAPPED_ALLOCATOR_H_
#define FITRUN_WORKER_MEMORY_CAPPED_ALLOCATOR_H_

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "worker/torch_compat.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace fitrun::worker {

// Gives a CPU "device" a real memory limit. Wraps another CPU allocator (LibTorch's default unless
// told otherwise), counts the bytes of every block it hands out until that block is freed, records
// the peak, and refuses a request that would take the live bytes past the cap by throwing
// c10::OutOfMemoryError, as the CUDA caching allocator does when a GPU is full. Requests refused
// leave the counts as they were.
//
// Once installed (Install) every CPU tensor LibTorch creates in the process goes through it; tensors
// that already existed keep their own deleters and are never counted. Blocks hold a reference to the
// counters, so a block freed after the allocator is gone is still subtracted safely.
//
// Thread-safe: AllocateBlock() and the deleters run on any thread (intra-op workers, the autograd
// engine, Gloo), the readers on any other. A cap of 0 means unlimited (counting only).
class CappedCpuAllocator final : public torch_compat::CpuAllocatorBase {
 public:
  // Beats the priority (0) LibTorch registers its default CPU allocator with.
  static constexpr uint8_t kInstallPriority = 100;

  // `wrapped` must outlive this allocator and every block it hands out; nullptr means
  // c10::GetDefaultCPUAllocator().
  explicit CappedCpuAllocator(int64_t cap_bytes, c10::Allocator* wrapped = nullptr);
  // Uninstalls first if still installed.
  ~CappedCpuAllocator() override;

  CappedCpuAllocator(const CappedCpuAllocator&) = delete;
  CappedCpuAllocator& operator=(const CappedCpuAllocator&) = delete;

  // c10::Allocator::allocate, whose signature differs between LibTorch versions (torch_compat.h).
  c10::DataPtr AllocateBlock(size_t n) const override;
  // Blocks carry their own bookkeeping, so LibTorch's raw_allocate/raw_deallocate (used by some
  // kernels for scratch space) work too.
  c10::DeleterFnPtr raw_deleter() const override { return &CappedCpuAllocator::DeleteBlock; }

  // Makes this the process's CPU allocator (c10::SetCPUAllocator at kInstallPriority).
  void Install();
  // Gives the CPU allocator back to the wrapped one, if this one is installed.
  void Uninstall();
  bool installed() const;

  int64_t cap_bytes() const { return cap_bytes_; }
  // Bytes handed out and not yet freed.
  int64_t Live() const;
  // Highest Live() since construction or the last ResetPeak().
  int64_t Peak() const;
  // Starts a new peak from what is live now (e.g. per training step or per probe batch size).
  void ResetPeak();
  // Size of the most recent request refused for the cap; 0 if none was.
  int64_t LastFailedRequest() const;
  // Live() when that request was refused (by the time an OOM is reported, unwinding has freed the
  // step's tensors, so Live() alone no longer shows what filled the device); 0 if none was.
  int64_t LiveAtLastFailure() const;

  // Called, on the allocating thread, whenever the figures above change in a way a reader outside
  // the process wants to see at once: the peak rises or is reset, or a request is refused. It must be
  // cheap and must not allocate through this allocator. nullptr: nobody (the default).
  using ChangeObserver = void (*)(const CappedCpuAllocator& allocator);
  void SetChangeObserver(ChangeObserver observer) { observer_.store(observer); }

 private:
  struct Counters {
    std::atomic<int64_t> live{0};
    std::atomic<int64_t> peak{0};
    std::atomic<int64_t> last_failed_request{0};
    std::atomic<int64_t> live_at_last_failure{0};
  };
  // What a counted block carries, in a header just before the data it hands out (so that the
  // DataPtr's context is its data pointer, as raw_allocate requires): the wrapped allocator's own
  // DataPtr of header and data together (freed with it) and the bytes to give back.
  struct BlockContext {
    c10::DataPtr original;
    int64_t bytes;
    std::shared_ptr<Counters> counters;
  };
  static void DeleteBlock(void* data);

  void Changed() const {
    if (ChangeObserver observer = observer_.load(std::memory_order_relaxed); observer != nullptr) observer(*this);
  }

  const int64_t cap_bytes_;
  c10::Allocator* const wrapped_;
  const std::shared_ptr<Counters> counters_;
  std::atomic<ChangeObserver> observer_{nullptr};
};

// Moves a model's parameters and buffers into storage from the now-installed CPU allocator, so that
// the weights count against the device as the estimator counts them. Values are unchanged. Throws
// c10::OutOfMemoryError when they do not fit the cap.
void MoveModuleStateIntoAllocator(torch::nn::Module& model);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MEMORY_CAPPED_ALLOCATOR_H_
