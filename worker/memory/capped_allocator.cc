#include "worker/memory/capped_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <utility>

namespace fitrun::worker {

CappedCpuAllocator::CappedCpuAllocator(int64_t cap_bytes, c10::Allocator* wrapped)
    : cap_bytes_(cap_bytes),
      wrapped_(wrapped != nullptr ? wrapped : c10::GetDefaultCPUAllocator()),
      counters_(std::make_shared<Counters>()) {}

CappedCpuAllocator::~CappedCpuAllocator() { Uninstall(); }

c10::DataPtr CappedCpuAllocator::allocate(size_t n) const {
  // Empty blocks own no memory: nothing to count.
  if (n == 0) return wrapped_->allocate(0);
  const int64_t bytes = static_cast<int64_t>(n);
  // Reserve before allocating so that concurrent requests can never together pass the cap.
  const int64_t live = counters_->live.fetch_add(bytes) + bytes;
  if (cap_bytes_ > 0 && live > cap_bytes_) {
    counters_->live.fetch_sub(bytes);
    counters_->last_failed_request.store(bytes);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU device memory cap exceeded: tried to allocate ", bytes,
                     " bytes with ", live - bytes, " bytes live and a cap of ", cap_bytes_, " bytes");
  }
  c10::DataPtr original;
  try {
    original = wrapped_->allocate(n);
  } catch (...) {
    counters_->live.fetch_sub(bytes);
    throw;
  }
  int64_t peak = counters_->peak.load();
  while (live > peak && !counters_->peak.compare_exchange_weak(peak, live)) {
  }
  void* data = original.get();
  const c10::Device device = original.device();
  auto* context = new BlockContext{std::move(original), bytes, counters_};
  return c10::DataPtr(data, context, &CappedCpuAllocator::DeleteBlock, device);
}

void CappedCpuAllocator::DeleteBlock(void* context) {
  auto* block = static_cast<BlockContext*>(context);
  block->counters->live.fetch_sub(block->bytes);
  delete block;  // frees the block through the wrapped allocator's deleter
}

void CappedCpuAllocator::Install() { c10::SetCPUAllocator(this, kInstallPriority); }

void CappedCpuAllocator::Uninstall() {
  if (installed()) c10::SetCPUAllocator(wrapped_, kInstallPriority);
}

bool CappedCpuAllocator::installed() const { return c10::GetCPUAllocator() == this; }

int64_t CappedCpuAllocator::Live() const { return counters_->live.load(); }

int64_t CappedCpuAllocator::Peak() const { return counters_->peak.load(); }

void CappedCpuAllocator::ResetPeak() { counters_->peak.store(counters_->live.load()); }

int64_t CappedCpuAllocator::LastFailedRequest() const { return counters_->last_failed_request.load(); }

}  // namespace fitrun::worker
