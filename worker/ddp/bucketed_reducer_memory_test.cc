// The reducer and the device's memory: gradients stay in their buckets whatever zeroed them, and
// buckets or hooks that do not fit the device are an OOM (ResourceExhausted), not a crash or a
// failed collective. Ranks are threads over a real Gloo group; the OOM cases use one rank, since the
// capped allocator that stands in for a full device is the whole process's.
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/thread_ranks.h"
#include "worker/memory/capped_allocator.h"

namespace fitrun::worker {
namespace {


BucketedReducer::Options OneParameterPerBucket() {
  BucketedReducer::Options options;
  options.first_bucket_cap_bytes = 1;
  options.bucket_cap_bytes = 1;
  return options;
}

std::vector<const void*> GradientPointers(const std::vector<at::Tensor>& parameters) {
  std::vector<const void*> pointers;
  for (const at::Tensor& p : parameters) pointers.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
  return pointers;
}

// LibTorch 2.x's zero_grad() sets gradients to None. Backward would then allocate each gradient
// anew beside its bucket and hold it through the step's micro-batches; the reducer points them at
// their slots again before backward, so they keep their storage and still average right.
TEST(BucketedReducerMemoryTest, GradientsSetToNoneGoBackIntoTheirBucketsBeforeBackward) {
  constexpr int kWorld = 2;
  constexpr int kMicroBatches = 2;
  at::manual_seed(3);
  const at::Tensor inputs = at::randn({kWorld, kMicroBatches, 3, 4});
  at::Tensor expected;  // w2's gradient: the mean over ranks of the sum over micro-batches
  {
    LinearChain chain;
    for (int rank = 0; rank < kWorld; ++rank) {
      for (int m = 0; m < kMicroBatches; ++m) chain.Forward(inputs[rank][m]).pow(2).mean().backward();
    }
    expected = chain.w2.grad() / kWorld;
  }
  RunRanksAsThreads(kWorld, "set_to_none_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    LinearChain chain;
    const std::vector<at::Tensor> parameters = chain.parameters();
    auto reducer = BucketedReducer::Create(group, parameters, OneParameterPerBucket());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    const std::vector<const void*> buckets = GradientPointers(parameters);
    for (const void* pointer : buckets) ASSERT_NE(pointer, nullptr);
    for (int step = 0; step < 2; ++step) {
      for (const at::Tensor& p : parameters) const_cast<at::Tensor&>(p).mutable_grad().reset();
      for (int m = 0; m < kMicroBatches; ++m) {
        (*reducer)->BeforeBackward(m == kMicroBatches - 1);
        EXPECT_EQ(GradientPointers(parameters), buckets) << "rank " << rank << " step " << step << " micro-batch " << m;
        chain.Forward(inputs[rank][m]).pow(2).mean().backward();
        EXPECT_EQ(GradientPointers(parameters), buckets)
            << "rank " << rank << " step " << step << ": backward allocated a gradient beside its bucket";
      }
      ASSERT_TRUE((*reducer)->Synchronize(0).ok());
      EXPECT_TRUE(at::allclose(chain.w2.grad(), expected, 1e-5, 1e-6)) << "rank " << rank << " step " << step;
    }
  });
}

// The buckets are as large as the gradients, allocated on the device when the reducer is made: on a
// full device that is an OOM for the rank to report, not an exception that ends it.
TEST(BucketedReducerMemoryTest, BucketsThatDoNotFitTheDeviceAreResourceExhausted) {
  RunRanksAsThreads(1, "buckets_oom_store", [](int, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    LinearChain chain;  // its weights are allocated before the cap, so only the buckets count
    CappedCpuAllocator device(/*cap_bytes=*/16);
    device.Install();
    absl::StatusOr<std::unique_ptr<BucketedReducer>> reducer =
        BucketedReducer::Create(group, chain.parameters(), OneParameterPerBucket());
    device.Uninstall();
    EXPECT_EQ(reducer.status().code(), absl::StatusCode::kResourceExhausted) << reducer.status();
    EXPECT_NE(reducer.status().message().find("allocating the gradient buckets (452 bytes on cpu)"),
              absl::string_view::npos)
        << reducer.status();
    EXPECT_GT(device.LastFailedRequest(), 0);
  });
}

// A bucket is handed to the communication hook from the autograd hook that completes it, during
// backward; the fp16 hook allocates its half-precision copy there. When that does not fit, the step
// is an OOM (ResourceExhausted from Synchronize), not a failed collective (Unavailable), which would
// restart the job at the same batch instead of re-planning it.
TEST(BucketedReducerMemoryTest, OutOfMemoryInAGradientHookIsResourceExhausted) {
  RunRanksAsThreads(1, "hook_oom_store", [](int, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    struct TwoVectors : torch::nn::Module {
      TwoVectors() {
        small = register_parameter("small", at::ones({16}));
        large = register_parameter("large", at::ones({16384}));
      }
      at::Tensor small, large;
    } model;
    BucketedReducer::Options options = OneParameterPerBucket();  // large alone launches during backward
    options.comm_hook.kind = CommHookOptions::Kind::kFp16;
    auto reducer = BucketedReducer::Create(group, model.parameters(), options);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    ASSERT_EQ((*reducer)->BucketLayout(), (std::vector<std::vector<int>>{{1}, {0}}));
    const at::Tensor loss = model.small.sum() + model.large.sum();
    (*reducer)->BeforeBackward(true);
    // Backward of a sum allocates next to nothing; the hook's 32 KiB half copy of `large` does not fit.
    CappedCpuAllocator device(/*cap_bytes=*/4096);
    device.Install();
    loss.backward();
    absl::StatusOr<double> synchronized = (*reducer)->Synchronize(0);
    device.Uninstall();
    EXPECT_EQ(synchronized.status().code(), absl::StatusCode::kResourceExhausted) << synchronized.status();
    EXPECT_EQ(device.LastFailedRequest(), 16384 * 2);
  });
}

}  // namespace
}  // namespace fitrun::worker
