#include "worker/memory/capped_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <new>
#include <utility>

namespace fitrun::worker {
namespace {

// Room for a block's BlockContext before its data; a multiple of LibTorch's 64-byte CPU alignment so
// that the data stays as aligned as the wrapped allocator's blocks.
constexpr size_t kHeaderBytes = 64;

}  // namespace

CappedCpuAllocator::CappedCpuAllocator(int64_t cap_bytes, c10::Allocator* wrapped)
    : cap_bytes_(cap_bytes),
      wrapped_(wrapped != nullptr ? wrapped : c10::GetDefaultCPUAllocator()),
      counters_(std::make_shared<Counters>()) {}

CappedCpuAllocator::~CappedCpuAllocator() { Uninstall(); }

c10::DataPtr CappedCpuAllocator::AllocateBlock(size_t n) const {
  // Empty blocks own no memory: nothing to count, and nothing for DeleteBlock to free.
  if (n == 0) return c10::DataPtr(nullptr, nullptr, &CappedCpuAllocator::DeleteBlock, c10::Device(c10::kCPU));
  const int64_t bytes = static_cast<int64_t>(n);
  // Reserve before allocating so that concurrent requests can never together pass the cap.
  const int64_t live = counters_->live.fetch_add(bytes) + bytes;
  if (cap_bytes_ > 0 && live > cap_bytes_) {
    counters_->live.fetch_sub(bytes);
    counters_->last_failed_request.store(bytes);
    counters_->live_at_last_failure.store(live - bytes);
    Changed();
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU device memory cap exceeded: tried to allocate ", bytes,
                     " bytes with ", live - bytes, " bytes live and a cap of ", cap_bytes_, " bytes");
  }
  c10::DataPtr original;
  try {
    original = wrapped_->allocate(n + kHeaderBytes);
  } catch (...) {
    counters_->live.fetch_sub(bytes);
    throw;
  }
  int64_t peak = counters_->peak.load();
  bool rose = false;
  while (live > peak && !(rose = counters_->peak.compare_exchange_weak(peak, live))) {
  }
  if (rose) Changed();
  char* base = static_cast<char*>(original.get());
  void* data = base + kHeaderBytes;
  const c10::Device device = original.device();
  static_assert(sizeof(BlockContext) <= kHeaderBytes && alignof(BlockContext) <= kHeaderBytes);
  new (base) BlockContext{std::move(original), bytes, counters_};
  return c10::DataPtr(data, data, &CappedCpuAllocator::DeleteBlock, device);
}

void CappedCpuAllocator::DeleteBlock(void* data) {
  if (data == nullptr) return;  // an empty block (raw_deallocate passes those too)
  auto* block = reinterpret_cast<BlockContext*>(static_cast<char*>(data) - kHeaderBytes);
  block->counters->live.fetch_sub(block->bytes);
  // The header lives in the memory `original` owns: take it out before that memory goes.
  c10::DataPtr original = std::move(block->original);
  block->~BlockContext();
}  // `original` frees header and data through the wrapped allocator's deleter

void CappedCpuAllocator::Install() { c10::SetCPUAllocator(this, kInstallPriority); }

void CappedCpuAllocator::Uninstall() {
  if (installed()) c10::SetCPUAllocator(wrapped_, kInstallPriority);
}

bool CappedCpuAllocator::installed() const { return c10::GetCPUAllocator() == this; }

int64_t CappedCpuAllocator::Live() const { return counters_->live.load(); }

int64_t CappedCpuAllocator::Peak() const { return counters_->peak.load(); }

void CappedCpuAllocator::ResetPeak() {
  counters_->peak.store(counters_->live.load());
  Changed();
}

int64_t CappedCpuAllocator::LastFailedRequest() const { return counters_->last_failed_request.load(); }

int64_t CappedCpuAllocator::LiveAtLastFailure() const { return counters_->live_at_last_failure.load(); }

void MoveModuleStateIntoAllocator(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (at::Tensor& t : model.parameters()) t.set_data(t.detach().clone());
  for (at::Tensor& t : model.buffers()) t.set_data(t.detach().clone());
}

}  // namespace fitrun::worker
