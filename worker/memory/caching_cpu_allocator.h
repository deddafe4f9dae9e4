#ifndef FITRUN_WORKER_MEMORY_CACHING_CPU_ALLOCATOR_H_
#define FITRUN_WORKER_MEMORY_CACHING_CPU_ALLOCATOR_H_

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "worker/torch_compat.h"

namespace fitrun::worker {

// Keeps freed large host blocks for the next request of the same size, as the CUDA caching allocator
// keeps GPU blocks. A training step asks for the same sizes every step; without a cache glibc maps
// each block above its mmap threshold afresh and unmaps it when it is freed, so every step takes a
// page fault per 4 KiB of its activations (on the cnn a sixth of the step). Requests below
// kMinCachedBytes come from glibc's heap, which reuses them already. At most `max_cached_bytes` stay
// cached: a block freed into a full cache goes back to the system.
//
// A rank's host memory is what it has live plus at most that much: by default fitrund gives each
// rank's process 2 GiB beyond its CPU device (kRankProcessHostBytes, server/core/specs/job_specs.h),
// which the bound below leaves room in beside LibTorch and the decoded dataset.
//
// Thread-safe: blocks are allocated and freed on any thread. Blocks hold a reference to the cache's
// pool, so one freed after the allocator is gone is given back to the system.
class CachingCpuAllocator final : public torch_compat::CpuAllocatorBase {
 public:
  static constexpr size_t kMinCachedBytes = size_t{128} << 10;
  // What a training rank's cache may hold.
  static constexpr int64_t kRankMaxCachedBytes = int64_t{256} << 20;

  explicit CachingCpuAllocator(int64_t max_cached_bytes);
  // Gives every cached block back to the system (blocks still in use are freed when they are).
  ~CachingCpuAllocator() override;

  CachingCpuAllocator(const CachingCpuAllocator&) = delete;
  CachingCpuAllocator& operator=(const CachingCpuAllocator&) = delete;

  c10::DataPtr AllocateBlock(size_t n) const override;
  // Every block carries its own header, so LibTorch's raw_allocate/raw_deallocate work too.
  c10::DeleterFnPtr raw_deleter() const override;

  // Makes this the process's CPU allocator (c10::SetCPUAllocator at the capped allocator's priority),
  // for a rank whose device has no cap; a capped device's allocator wraps this one instead.
  void Install();

  // Bytes held for reuse, not in use.
  int64_t CachedBytes() const;
  // Requests served from the cache.
  int64_t Hits() const;

 private:
  struct Pool;
  // The deleter of every block: into the cache when it fits there, else back to the system.
  static void FreeBlock(void* data);

  const std::shared_ptr<Pool> pool_;
};

// The process's cache for training and probing ranks, made on first use and never freed (LibTorch
// keeps an installed allocator, and the blocks it handed out, to the end of the process).
CachingCpuAllocator* RankHostBlockCache();

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MEMORY_CACHING_CPU_ALLOCATOR_H_
