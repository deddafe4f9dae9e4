#include "worker/memory/caching_cpu_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <new>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "worker/memory/capped_allocator.h"

namespace fitrun::worker {
namespace {

// Room for a block's header before its data; LibTorch's 64-byte CPU alignment, so that the data is as
// aligned as c10::alloc_cpu's.
constexpr size_t kHeaderBytes = 64;

}  // namespace

struct CachingCpuAllocator::Pool {
  // What each block carries before its data.
  struct Header {
    c10::DataPtr original;  // LibTorch's default CPU allocator's block of header and data together
    std::shared_ptr<Pool> pool;
    size_t bytes;
  };
  static_assert(sizeof(Header) <= kHeaderBytes && alignof(Header) <= kHeaderBytes);

  explicit Pool(int64_t max_cached) : max_cached_bytes(max_cached) {}

  // Takes a freed block of `bytes` (its header intact) into the cache; false when it does not fit.
  bool Keep(void* base, size_t bytes) {
    if (bytes < kMinCachedBytes) return false;
    absl::MutexLock lock(&mu);
    if (closed || cached_bytes + static_cast<int64_t>(bytes) > max_cached_bytes) return false;
    free_blocks[bytes].push_back(base);
    cached_bytes += static_cast<int64_t>(bytes);
    return true;
  }

  // A cached block of exactly `bytes`, or nullptr.
  void* Take(size_t bytes) {
    if (bytes < kMinCachedBytes) return nullptr;
    absl::MutexLock lock(&mu);
    auto it = free_blocks.find(bytes);
    if (it == free_blocks.end() || it->second.empty()) return nullptr;
    void* base = it->second.back();
    it->second.pop_back();
    cached_bytes -= static_cast<int64_t>(bytes);
    ++hits;
    return base;
  }

  // Gives a block's memory back to the system (its header first).
  static void Release(void* base);

  // Stops caching and hands out what it held, for the caller to free.
  std::vector<void*> Close() {
    absl::MutexLock lock(&mu);
    closed = true;
    std::vector<void*> out;
    for (auto& [bytes, blocks] : free_blocks) out.insert(out.end(), blocks.begin(), blocks.end());
    free_blocks.clear();
    cached_bytes = 0;
    return out;
  }

  const int64_t max_cached_bytes;
  mutable absl::Mutex mu;
  absl::flat_hash_map<size_t, std::vector<void*>> free_blocks ABSL_GUARDED_BY(mu);
  int64_t cached_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t hits ABSL_GUARDED_BY(mu) = 0;
  bool closed ABSL_GUARDED_BY(mu) = false;
};

void CachingCpuAllocator::Pool::Release(void* base) {
  auto* header = static_cast<Header*>(base);
  // The header lives in the memory `original` owns: take it out before that memory goes.
  c10::DataPtr original = std::move(header->original);
  header->~Header();
}  // `original` frees header and data

void CachingCpuAllocator::FreeBlock(void* data) {
  if (data == nullptr) return;  // an empty block
  void* base = static_cast<char*>(data) - kHeaderBytes;
  auto* header = static_cast<Pool::Header*>(base);
  // Keep() may make the block another thread's at once: nothing here reads it afterwards.
  if (header->pool->Keep(base, header->bytes)) return;
  Pool::Release(base);
}

CachingCpuAllocator::CachingCpuAllocator(int64_t max_cached_bytes)
    : pool_(std::make_shared<Pool>(max_cached_bytes)) {}

CachingCpuAllocator::~CachingCpuAllocator() {
  for (void* base : pool_->Close()) Pool::Release(base);
}

c10::DataPtr CachingCpuAllocator::AllocateBlock(size_t n) const {
  if (n == 0) return c10::DataPtr(nullptr, nullptr, &FreeBlock, c10::Device(c10::kCPU));
  void* base = pool_->Take(n);
  if (base == nullptr) {
    // Throws c10::Error, as LibTorch's own CPU allocator does, when the system has no more.
    c10::DataPtr original = c10::GetDefaultCPUAllocator()->allocate(n + kHeaderBytes);
    base = original.get();
    new (base) Pool::Header{std::move(original), pool_, n};
  }
  void* data = static_cast<char*>(base) + kHeaderBytes;
  return c10::DataPtr(data, data, &FreeBlock, c10::Device(c10::kCPU));
}

c10::DeleterFnPtr CachingCpuAllocator::raw_deleter() const { return &FreeBlock; }

void CachingCpuAllocator::Install() { c10::SetCPUAllocator(this, CappedCpuAllocator::kInstallPriority); }

int64_t CachingCpuAllocator::CachedBytes() const {
  absl::MutexLock lock(&pool_->mu);
  return pool_->cached_bytes;
}

int64_t CachingCpuAllocator::Hits() const {
  absl::MutexLock lock(&pool_->mu);
  return pool_->hits;
}

CachingCpuAllocator* RankHostBlockCache() {
  static CachingCpuAllocator* cache = new CachingCpuAllocator(CachingCpuAllocator::kRankMaxCachedBytes);
  return cache;
}

}  // namespace fitrun::worker
