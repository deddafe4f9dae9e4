// Two ranks as two threads of one process over a real Gloo group, as PyTorch's c10d tests do.
#include "worker/ddp/bucketed_reducer.h"
#include "worker/models/recompute.h"


#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/ddp/process_group.h"
#include "worker/ddp/thread_ranks.h"

namespace fitrun::worker {
namespace {

constexpr int kWorld = 2;

void RunRanks(const std::string& store_name,
              const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& body,
              absl::Duration timeout = absl::Seconds(10)) {
  RunRanksAsThreads(kWorld, store_name, body, timeout);
}


BucketedReducer::Options SmallBuckets() {
  BucketedReducer::Options options;
  // w3 (64 B) alone in the first bucket, w2 (256 B) alone, then w1 (128 B).
  options.first_bucket_cap_bytes = 64;
  options.bucket_cap_bytes = 256;
  return options;
}

TEST(BucketedReducerTest, BucketsFollowReverseRegistrationOrderAndCaps) {
  RunRanks("layout_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::manual_seed(1);
    LinearChain chain;
    auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    EXPECT_EQ((*reducer)->BucketLayout(), (std::vector<std::vector<int>>{{2}, {1}, {0}}));

    BucketedReducer::Options big;
    auto one_bucket = BucketedReducer::Create(group, chain.parameters(), big);
    ASSERT_TRUE(one_bucket.ok());
    EXPECT_EQ((*one_bucket)->BucketLayout(), (std::vector<std::vector<int>>{{2, 1, 0}}));
  });
}

// PyTorch's compute_bucket_assignment_by_size: a bucket takes parameters until it reaches its cap,
// including the one that takes it past (w3 64 B + w2 256 B >= 100 B), then the next cap applies.
// The built-in mlp's first bucket is fc3 and fc2 (1.07 MB past 1 MiB), as PyTorch's.
TEST(BucketedReducerTest, BucketsCloseOnceTheyReachTheirCapAsPyTorchDoes) {
  RunRanks("cap_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    LinearChain chain;
    BucketedReducer::Options options;
    options.first_bucket_cap_bytes = 100;
    options.bucket_cap_bytes = 100;
    auto reducer = BucketedReducer::Create(group, chain.parameters(), options);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    EXPECT_EQ((*reducer)->BucketLayout(), (std::vector<std::vector<int>>{{2, 1}, {0}}));
  });
}

// The gradients (w1, w2, w3) of the chain's mean squared output over all of `inputs`, on one
// process: what two ranks with half the inputs each must hold after Synchronize.
std::vector<at::Tensor> WholeBatchGradients(const at::Tensor& inputs) {
  at::manual_seed(1);
  LinearChain chain;
  chain.Forward(inputs).pow(2).mean().backward();
  return {chain.w1.grad().clone(), chain.w2.grad().clone(), chain.w3.grad().clone()};
}

// Each rank's gradients differ (different inputs); after Synchronize both hold the mean, equal to
// the gradient of the mean loss computed on one process with both ranks' inputs.
TEST(BucketedReducerTest, AveragesGradientsLikeOneProcessWithTheWholeBatch) {
  at::manual_seed(3);
  const at::Tensor inputs = at::randn({6, 4});
  const std::vector<at::Tensor> expected = WholeBatchGradients(inputs);
  const at::Tensor& expected_w1 = expected[0];
  const at::Tensor& expected_w3 = expected[2];
  RunRanks("average_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::manual_seed(1);
    LinearChain chain;
    auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    for (int step = 0; step < 2; ++step) {  // the second step checks the state reset
      chain.zero_grad();
      (*reducer)->BeforeBackward(true);
      const at::Tensor loss = chain.Forward(inputs.narrow(0, 3 * rank, 3)).pow(2).mean();
      loss.backward();
      absl::StatusOr<double> mean_loss = (*reducer)->Synchronize(rank == 0 ? 1.0 : 3.0);
      ASSERT_TRUE(mean_loss.ok()) << mean_loss.status();
      EXPECT_DOUBLE_EQ(*mean_loss, 2.0);
      EXPECT_TRUE(at::allclose(chain.w1.grad(), expected_w1, 1e-5, 1e-6)) << "rank " << rank;
      EXPECT_TRUE(at::allclose(chain.w3.grad(), expected_w3, 1e-5, 1e-6)) << "rank " << rank;
    }
    EXPECT_EQ((*reducer)->comm_stats().synchronized_steps, 2);
  });
}

// Activation checkpointing under DDP: the first two layers recomputed in backward (a nested
// backward inside autograd's) still reach their accumulators, whose hooks fill the buckets.
TEST(BucketedReducerTest, ARecomputedBlockReducesLikeAPlainOne) {
  at::manual_seed(3);
  const at::Tensor inputs = at::randn({6, 4});
  const std::vector<at::Tensor> expected = WholeBatchGradients(inputs);
  const at::Tensor& expected_w1 = expected[0];
  const at::Tensor& expected_w2 = expected[1];
  RunRanks("recompute_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::manual_seed(1);
    LinearChain chain;
    auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    // The input must need a gradient for the block to be recomputed at all (RecomputedInBackward).
    const at::Tensor x = inputs.narrow(0, 3 * rank, 3).clone().requires_grad_(true);
    (*reducer)->BeforeBackward(true);
    int runs = 0;
    const at::Tensor hidden = RecomputedInBackward(
        [&chain, &runs](const at::Tensor& in) {
          ++runs;
          return at::matmul(at::matmul(in, chain.w1.t()), chain.w2.t());
        },
        x);
    at::matmul(hidden, chain.w3.t()).pow(2).mean().backward();
    EXPECT_EQ(runs, 2) << "the block runs in forward and again in backward";
    ASSERT_TRUE((*reducer)->Synchronize(1.0).ok());
    EXPECT_TRUE(at::allclose(chain.w1.grad(), expected_w1, 1e-5, 1e-6)) << "rank " << rank;
    EXPECT_TRUE(at::allclose(chain.w2.grad(), expected_w2, 1e-5, 1e-6)) << "rank " << rank;
  });
}

// The buckets are allocated on the parameters' device: after a step on an explicit CPU device the
// gradients (bucket slots) are there and hold the average. Parameters split across devices are
// refused, since one bucket cannot hold both (the meta device stands in for a second device here).
TEST(BucketedReducerTest, BucketsLiveOnTheParametersDevice) {
  const c10::Device device(c10::kCPU);
  RunRanks("device_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::manual_seed(1);
    LinearChain chain;
    chain.to(device);
    auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    (*reducer)->BeforeBackward(true);
    chain.Forward(at::full({3, 4}, rank + 1.0, at::TensorOptions().device(device))).sum().backward();
    absl::StatusOr<double> loss = (*reducer)->Synchronize(rank);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_DOUBLE_EQ(*loss, 0.5);
    for (const at::Tensor& p : chain.parameters()) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().device(), device);
    }

    std::vector<at::Tensor> mixed = chain.parameters();
    mixed[1] = at::zeros({8, 8}, at::TensorOptions().device(at::kMeta)).requires_grad_();
    absl::StatusOr<std::unique_ptr<BucketedReducer>> refused =
        BucketedReducer::Create(group, mixed, SmallBuckets());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented) << refused.status();
  });
}

// gradient_as_bucket_view: after the first step every gradient is its bucket slot and stays so
// through the optimizer's zero_grad (which detaches and zeroes in place), and later steps, which
// AccumulateGrad writes straight into the buckets, still average correctly.
TEST(BucketedReducerTest, GradientsStayBucketViewsAcrossSteps) {
  at::manual_seed(3);
  const at::Tensor inputs = at::randn({2, 6, 4});
  std::vector<at::Tensor> expected;
  {
    at::manual_seed(1);
    LinearChain chain;
    for (int step = 0; step < 2; ++step) {
      chain.w2.mutable_grad() = at::Tensor();
      chain.Forward(inputs[step]).pow(2).mean().backward();
      expected.push_back(chain.w2.grad().clone());
    }
  }
  RunRanks("views_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::manual_seed(1);
    LinearChain chain;
    auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    torch::optim::SGD optimizer(chain.parameters(), torch::optim::SGDOptions(0.1));
    std::vector<const void*> first_step_grads;
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      (*reducer)->BeforeBackward(true);
      chain.Forward(inputs[step].narrow(0, 3 * rank, 3)).pow(2).mean().backward();
      ASSERT_TRUE((*reducer)->Synchronize(0).ok());
      EXPECT_TRUE(at::allclose(chain.w2.grad(), expected[step], 1e-5, 1e-6)) << "rank " << rank;
      std::vector<const void*> grads;
      for (const at::Tensor& p : chain.parameters()) grads.push_back(p.grad().data_ptr());
      if (step == 0) {
        first_step_grads = grads;
      } else {
        EXPECT_EQ(grads, first_step_grads) << "a gradient left its bucket";
      }
    }
  });
}

// no_sync: micro-batches before the last accumulate locally; the hooks of the last reduce the sum.
TEST(BucketedReducerTest, AccumulatesEarlierMicroBatchesWithoutCommunicating) {
  at::manual_seed(3);
  const at::Tensor inputs = at::randn({8, 4});
  at::Tensor expected;
  {
    at::manual_seed(1);
    LinearChain chain;
    chain.Forward(inputs).pow(2).mean().backward();
    expected = chain.w2.grad().clone();
  }
  RunRanks("accumulate_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::manual_seed(1);
    LinearChain chain;
    auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    for (int m = 0; m < 2; ++m) {
      (*reducer)->BeforeBackward(m == 1);
      (chain.Forward(inputs.narrow(0, 4 * rank + 2 * m, 2)).pow(2).mean() / 2).backward();
    }
    ASSERT_TRUE((*reducer)->Synchronize(0).ok());
    EXPECT_TRUE(at::allclose(chain.w2.grad(), expected, 1e-5, 1e-6)) << "rank " << rank;
  });
}

// Every hook through the reducer: the gradients are the hook's mean (fp16 and bf16 near the true
// one; PowerSGD exact through its plain steps, then compressed), identical on both ranks, and the
// loss riding in the last bucket stays the exact float32 mean under every hook.
TEST(BucketedReducerTest, CommHooksReduceEveryBucketAndKeepTheLossExact) {
  at::manual_seed(3);
  const at::Tensor inputs = at::randn({4, 6, 4});
  std::vector<at::Tensor> expected;
  {
    LinearChain chain;
    for (int step = 0; step < 4; ++step) {
      chain.w2.mutable_grad() = at::Tensor();
      chain.Forward(inputs[step]).pow(2).mean().backward();
      expected.push_back(chain.w2.grad().clone());
    }
  }
  for (CommHookOptions::Kind kind : {CommHookOptions::Kind::kFp16, CommHookOptions::Kind::kBf16,
                                     CommHookOptions::Kind::kPowerSgd}) {
    const int kind_number = static_cast<int>(kind);
    std::vector<std::vector<at::Tensor>> grads(kWorld);
    RunRanks("hooks_store_" + std::to_string(kind_number), [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
      LinearChain chain;
      BucketedReducer::Options options = SmallBuckets();
      options.comm_hook.kind = kind;
      options.comm_hook.powersgd_start_iter = 2;
      auto reducer = BucketedReducer::Create(group, chain.parameters(), options);
      ASSERT_TRUE(reducer.ok()) << reducer.status();
      for (int step = 0; step < 4; ++step) {
        chain.zero_grad();
        (*reducer)->BeforeBackward(true);
        chain.Forward(inputs[step].narrow(0, 3 * rank, 3)).pow(2).mean().backward();
        absl::StatusOr<double> loss = (*reducer)->Synchronize(rank == 0 ? 1.0001 : 3.0007);
        ASSERT_TRUE(loss.ok()) << loss.status();
        EXPECT_EQ(*loss, static_cast<double>((1.0001f + 3.0007f) / 2)) << "hook " << kind_number << " step " << step;
        if (kind != CommHookOptions::Kind::kPowerSgd) {
          EXPECT_TRUE(at::allclose(chain.w2.grad(), expected[step], 2e-2, 1e-2)) << "hook " << kind_number;
        } else if (step < 2) {
          EXPECT_TRUE(at::allclose(chain.w2.grad(), expected[step], 1e-5, 1e-6)) << "step " << step;
        }
        grads[rank].push_back(chain.w2.grad().clone());
      }
    });
    for (int step = 0; step < 4; ++step) {
      EXPECT_TRUE(at::equal(grads[0][step], grads[1][step])) << "hook " << kind_number << " step " << step;
    }
  }
}

// A parameter one rank's backward never reaches still takes part (as zeros): no rank hangs.
TEST(BucketedReducerTest, UnreachedParameterCountsAsZero) {
  RunRanks("unused_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    at::manual_seed(1);
    LinearChain chain;
    auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    (*reducer)->BeforeBackward(true);
    if (rank == 0) {
      chain.w3.sum().backward();  // only w3
    } else {
      chain.Forward(at::ones({1, 4})).sum().backward();
    }
    ASSERT_TRUE((*reducer)->Synchronize(0).ok());
    EXPECT_TRUE(chain.w1.grad().defined());
  });
}

// A peer that is alive but stops taking part: the waiting rank fails within the collective timeout
// with DeadlineExceeded instead of blocking forever.
TEST(BucketedReducerTest, PeerThatStopsParticipatingTimesOut) {
  absl::Notification done;
  absl::Duration waited;
  RunRanks(
      "timeout_store",
      [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
        at::manual_seed(1);
        LinearChain chain;
        auto reducer = BucketedReducer::Create(group, chain.parameters(), SmallBuckets());
        ASSERT_TRUE(reducer.ok()) << reducer.status();
        if (rank == 1) {
          done.WaitForNotificationWithTimeout(absl::Seconds(20));  // silent but connected
          return;
        }
        const absl::Time start = absl::Now();
        (*reducer)->BeforeBackward(true);
        chain.Forward(at::ones({1, 4})).sum().backward();
        absl::StatusOr<double> loss = (*reducer)->Synchronize(0);
        waited = absl::Now() - start;
        done.Notify();
        ASSERT_FALSE(loss.ok());
        EXPECT_EQ(loss.status().code(), absl::StatusCode::kDeadlineExceeded) << loss.status();
      },
      absl::Seconds(2));
  EXPECT_GE(waited, absl::Milliseconds(1500));
  EXPECT_LT(waited, absl::Seconds(8));
}

}  // namespace
}  // namespace fitrun::worker
