#include "worker/memory/caching_cpu_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/memory/capped_allocator.h"

namespace fitrun::worker {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(CachingCpuAllocatorTest, AFreedLargeBlockServesTheNextRequestOfItsSize) {
  CachingCpuAllocator cache(/*max_cached_bytes=*/64 * kMiB);
  void* first = nullptr;
  {
    c10::DataPtr block = cache.allocate(4 * kMiB);
    first = block.get();
    static_cast<char*>(first)[4 * kMiB - 1] = 7;  // the whole block is usable memory
  }
  EXPECT_EQ(cache.CachedBytes(), static_cast<int64_t>(4 * kMiB));
  {
    c10::DataPtr other_size = cache.allocate(2 * kMiB);
    EXPECT_NE(other_size.get(), first);
    EXPECT_EQ(cache.Hits(), 0);
  }
  c10::DataPtr again = cache.allocate(4 * kMiB);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(cache.Hits(), 1);
  EXPECT_EQ(cache.CachedBytes(), static_cast<int64_t>(2 * kMiB));  // the 2 MiB block, freed above
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again.get()) % 64, 0u) << "LibTorch's CPU alignment";
}

TEST(CachingCpuAllocatorTest, SmallBlocksAreLeftToTheHeap) {
  CachingCpuAllocator cache(/*max_cached_bytes=*/64 * kMiB);
  for (int i = 0; i < 3; ++i) (void)cache.allocate(CachingCpuAllocator::kMinCachedBytes - 1);
  EXPECT_EQ(cache.CachedBytes(), 0);
  EXPECT_EQ(cache.Hits(), 0);
}

TEST(CachingCpuAllocatorTest, HoldsNoMoreThanItsBound) {
  CachingCpuAllocator cache(/*max_cached_bytes=*/10 * kMiB);
  {
    std::vector<c10::DataPtr> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(cache.allocate(3 * kMiB));
  }  // four freed; three fit
  EXPECT_EQ(cache.CachedBytes(), static_cast<int64_t>(9 * kMiB));
  (void)cache.allocate(2 * kMiB);  // freed into a cache without room for it
  EXPECT_EQ(cache.CachedBytes(), static_cast<int64_t>(9 * kMiB));
}

TEST(CachingCpuAllocatorTest, ABlockMayOutliveTheAllocator) {
  c10::DataPtr survivor;
  {
    CachingCpuAllocator cache(/*max_cached_bytes=*/64 * kMiB);
    (void)cache.allocate(1 * kMiB);  // cached, then given back with the cache
    survivor = cache.allocate(2 * kMiB);
  }
  static_cast<char*>(survivor.get())[0] = 1;
  survivor.clear();  // freed to the system, not into the cache that is gone (ASan checks both)
}

TEST(CachingCpuAllocatorTest, RawAllocateAndDeallocateGoThroughTheCache) {
  CachingCpuAllocator cache(/*max_cached_bytes=*/64 * kMiB);
  void* raw = cache.raw_allocate(1 * kMiB);
  cache.raw_deallocate(raw);
  EXPECT_EQ(cache.CachedBytes(), static_cast<int64_t>(1 * kMiB));
  void* small = cache.raw_allocate(16);
  cache.raw_deallocate(small);
}

// Under a capped device the cap counts what tensors hold, never what the cache keeps for reuse.
TEST(CachingCpuAllocatorTest, TheCapCountsLiveTensorsNotTheCache) {
  CachingCpuAllocator cache(/*max_cached_bytes=*/64 * kMiB);
  CappedCpuAllocator capped(/*cap_bytes=*/8 * kMiB, &cache);
  capped.Install();
  for (int step = 0; step < 5; ++step) {
    at::Tensor activations = at::ones({static_cast<int64_t>(6 * kMiB / sizeof(float))}, at::kFloat);
    EXPECT_FLOAT_EQ(activations.sum().item<float>(), static_cast<float>(6 * kMiB / sizeof(float)));
  }
  EXPECT_EQ(capped.Live(), 0);
  EXPECT_GE(cache.Hits(), 4) << "each step after the first reuses the first step's block";
  EXPECT_THROW(at::empty({static_cast<int64_t>(9 * kMiB)}, at::kByte), c10::OutOfMemoryError);
  capped.Uninstall();
}

TEST(CachingCpuAllocatorTest, ThreadsShareItSafely) {
  CachingCpuAllocator cache(/*max_cached_bytes=*/16 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t bytes = (1 + (i + t) % 3) * kMiB;
        c10::DataPtr block = cache.allocate(bytes);
        auto* data = static_cast<unsigned char*>(block.get());
        data[0] = static_cast<unsigned char>(t);
        data[bytes - 1] = static_cast<unsigned char>(t);
        std::this_thread::yield();
        ASSERT_EQ(data[0], t) << "a block handed to two holders at once";
        ASSERT_EQ(data[bytes - 1], t);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_LE(cache.CachedBytes(), static_cast<int64_t>(16 * kMiB));
  EXPECT_GT(cache.Hits(), 0);
}

}  // namespace
}  // namespace fitrun::worker
