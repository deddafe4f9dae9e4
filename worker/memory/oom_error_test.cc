#include "worker/memory/oom_error.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <stdexcept>

#include "gtest/gtest.h"
#include "worker/memory/capped_allocator.h"

namespace fitrun::worker {
namespace {

TEST(OomErrorTest, TheCappedAllocatorsRefusalIsResourceExhausted) {
  CappedCpuAllocator memory(/*cap_bytes=*/4096);
  memory.Install();
  absl::Status status;
  try {
    (void)at::empty({1 << 20}, at::kFloat);
    ADD_FAILURE() << "the cap did not refuse 4 MiB";
  } catch (const std::exception& e) {
    EXPECT_TRUE(IsOutOfMemory(e));
    status = StatusFromTorchException(e, "moving the model to cpu");
  }
  memory.Uninstall();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("moving the model to cpu: out of device memory: CPU device memory cap exceeded"),
            absl::string_view::npos)
      << status;
}

// The CUDA runtime's and cuBLAS's own allocations fail as plain c10::Errors, not OutOfMemoryError.
TEST(OomErrorTest, CudaAllocationsOutsideTheCachingAllocatorAreOutOfMemoryToo) {
  for (const char* text : {"CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
                           "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                           "NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled cuda error, NCCL version 2.28.9\n"
                           "Last error:\nCuda failure 'out of memory'"}) {
    const c10::Error error(c10::SourceLocation{"f", "file.cc", 1}, text);
    EXPECT_TRUE(IsOutOfMemory(error)) << text;
    EXPECT_EQ(StatusFromTorchException(error, "step 3").code(), absl::StatusCode::kResourceExhausted) << text;
  }
  const c10::Error other(c10::SourceLocation{"f", "file.cc", 1}, "Expected all tensors to be on the same device");
  EXPECT_FALSE(IsOutOfMemory(other));
  EXPECT_EQ(StatusFromTorchException(other, "step 3").code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(IsOutOfMemory(std::runtime_error("connection reset by peer")));
}

}  // namespace
}  // namespace fitrun::worker
