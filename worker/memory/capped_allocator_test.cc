#include "worker/memory/capped_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <string>

#include "gtest/gtest.h"

namespace fitrun::worker {
namespace {

constexpr int64_t kKiB = 1024;

// 4 KiB of float32.
at::Tensor FourKiB() { return at::empty({static_cast<int64_t>(kKiB)}, at::kFloat); }

TEST(CappedCpuAllocatorTest, InstallsOverTheDefaultAndUninstalls) {
  {
    CappedCpuAllocator allocator(/*cap_bytes=*/0);
    allocator.Install();
    EXPECT_TRUE(allocator.installed());
    EXPECT_EQ(c10::GetCPUAllocator(), &allocator);
    allocator.Uninstall();
    EXPECT_FALSE(allocator.installed());
  }
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
}

TEST(CappedCpuAllocatorTest, LiveAndPeakFollowTensors) {
  CappedCpuAllocator allocator(/*cap_bytes=*/0);
  allocator.Install();
  EXPECT_EQ(allocator.Live(), 0);
  {
    at::Tensor a = FourKiB();
    EXPECT_EQ(allocator.Live(), 4 * kKiB);
    {
      at::Tensor b = at::empty({2 * kKiB}, at::kFloat);
      EXPECT_EQ(allocator.Live(), 12 * kKiB);
      EXPECT_EQ(allocator.Peak(), 12 * kKiB);
    }
    EXPECT_EQ(allocator.Live(), 4 * kKiB);
    EXPECT_EQ(allocator.Peak(), 12 * kKiB);
    a.fill_(1.0f);  // the block is usable memory
    EXPECT_FLOAT_EQ(a.sum().item<float>(), static_cast<float>(kKiB));
  }
  EXPECT_EQ(allocator.Live(), 0);
  EXPECT_EQ(allocator.Peak(), 12 * kKiB);
  EXPECT_EQ(allocator.LastFailedRequest(), 0);
}

TEST(CappedCpuAllocatorTest, TensorsFromBeforeInstallAreNotCounted) {
  at::Tensor before = FourKiB();
  CappedCpuAllocator allocator(/*cap_bytes=*/0);
  allocator.Install();
  at::Tensor after = FourKiB();
  before = at::Tensor();
  EXPECT_EQ(allocator.Live(), 4 * kKiB);
}

TEST(CappedCpuAllocatorTest, PastTheCapThrowsOutOfMemoryAndCountsNothing) {
  CappedCpuAllocator allocator(/*cap_bytes=*/10 * kKiB);
  allocator.Install();
  at::Tensor a = FourKiB();
  at::Tensor b = FourKiB();
  ASSERT_EQ(allocator.Live(), 8 * kKiB);

  try {
    at::Tensor c = FourKiB();
    FAIL() << "allocating past the cap did not throw";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("tried to allocate 4096 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("8192 bytes live"), std::string::npos) << message;
    EXPECT_NE(message.find("cap of 10240 bytes"), std::string::npos) << message;
  }
  EXPECT_EQ(allocator.Live(), 8 * kKiB);
  EXPECT_EQ(allocator.Peak(), 8 * kKiB);
  EXPECT_EQ(allocator.LastFailedRequest(), 4 * kKiB);

  // Exactly up to the cap is allowed.
  at::Tensor fits = at::empty({512}, at::kFloat);
  EXPECT_EQ(allocator.Live(), 10 * kKiB);
}

TEST(CappedCpuAllocatorTest, ResetPeakStartsFromWhatIsLive) {
  CappedCpuAllocator allocator(/*cap_bytes=*/0);
  allocator.Install();
  at::Tensor kept = FourKiB();
  { at::Tensor dropped = at::empty({4 * kKiB}, at::kFloat); }
  EXPECT_EQ(allocator.Peak(), 20 * kKiB);
  allocator.ResetPeak();
  EXPECT_EQ(allocator.Peak(), 4 * kKiB);
  { at::Tensor next = FourKiB(); }
  EXPECT_EQ(allocator.Peak(), 8 * kKiB);
}

TEST(CappedCpuAllocatorTest, LinearForwardAndBackwardAreCounted) {
  CappedCpuAllocator allocator(/*cap_bytes=*/0);
  allocator.Install();
  constexpr int64_t kIn = 256, kOut = 128, kBatch = 64;
  const int64_t parameter_bytes = (kIn * kOut + kOut) * 4;
  {
    torch::nn::Linear linear(kIn, kOut);
    EXPECT_GE(allocator.Live(), parameter_bytes);
    const int64_t before_step = allocator.Live();
    allocator.ResetPeak();
    at::Tensor input = torch::randn({kBatch, kIn});
    at::Tensor loss = linear->forward(input).relu().sum();
    loss.backward();
    // Input, activations and one gradient per parameter were all live at once.
    EXPECT_GE(allocator.Peak(), before_step + kBatch * kIn * 4 + kBatch * kOut * 4 + parameter_bytes);
    // Gradients stay with the parameters.
    ASSERT_TRUE(linear->weight.grad().defined());
    EXPECT_GE(allocator.Live(), before_step + parameter_bytes);
  }
  EXPECT_EQ(allocator.Live(), 0);
}

TEST(CappedCpuAllocatorTest, ABackwardPastTheCapThrowsOutOfMemory) {
  torch::nn::Linear linear(256, 256);
  at::Tensor input = torch::randn({1024, 256});
  CappedCpuAllocator allocator(/*cap_bytes=*/64 * kKiB);
  allocator.Install();
  EXPECT_THROW(linear->forward(input).sum().backward(), c10::OutOfMemoryError);
  EXPECT_EQ(allocator.LastFailedRequest(), 1024 * 256 * 4);
  EXPECT_EQ(allocator.Live(), 0);
}

}  // namespace
}  // namespace fitrun::worker
