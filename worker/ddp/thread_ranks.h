// Test support: N ranks as threads of one process over a real Gloo group on a FileStore, the way
// PyTorch's c10d tests exercise collectives without a GPU or a second process; one rank alone gets
// the worker's single-rank group (CreateSingleRankProcessGroup), as a one-rank CPU job does.
//
// Where the LibTorch ships no Gloo (the pip wheels of LibTorch 2.x, which worker/CMakeLists.txt builds
// the tests against without USE_C10D_GLOO) there is no CPU backend for several ranks: a test that
// needs them skips, naming why, and what one rank tests still runs.
#ifndef FITRUN_WORKER_DDP_THREAD_RANKS_H_
#define FITRUN_WORKER_DDP_THREAD_RANKS_H_

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace fitrun::worker {

// Why a test that needs several CPU ranks is skipped in a build without Gloo.
inline constexpr char kNoCpuRanksReason[] =
    "LibTorch 2.x's pip wheel ships no Gloo: no CPU backend for several ranks";

// Whether this build can run `world` CPU ranks: any number with Gloo, one without.
bool CpuRanksAvailable(int world);

// Skips the running test with kNoCpuRanksReason unless CpuRanksAvailable(world), and ends it there:
// GTEST_SKIP() only returns from the function it is in, so this also unwinds the test body (gtest takes
// a testing::AssertionException as a result already reported), and nothing after the call runs, even
// when a helper calls it. Call it on the test's own thread. A no-op with Gloo.
void SkipUnlessCpuRanks(int world);

// A path under TEST_TMPDIR with nothing at it yet.
std::string FreshTestPath(const std::string& name);

// Runs body(rank, group) on `world` threads whose groups meet through the FileStore `store_name`,
// and returns when every thread has. A group that cannot be built fails the test. Skips the test
// (SkipUnlessCpuRanks) where this build cannot run `world` CPU ranks.
void RunRanksAsThreads(int world, const std::string& store_name,
                       const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& body,
                       absl::Duration timeout = absl::Seconds(10));

// Three linear maps in a chain, 4 -> 8 -> 8 -> 2, registered first to last: the model the reducer's
// tests train. Its weights come from a generator of its own: ranks are threads here, and two ranks
// drawing from the shared global generator at once would start from different weights.
struct LinearChain : torch::nn::Module {
  LinearChain() {
    at::Generator generator = at::detail::createCPUGenerator(/*seed_val=*/1);
    w1 = register_parameter("w1", at::randn({8, 4}, generator));
    w2 = register_parameter("w2", at::randn({8, 8}, generator));
    w3 = register_parameter("w3", at::randn({2, 8}, generator));
  }
  at::Tensor Forward(const at::Tensor& x) { return at::matmul(at::matmul(at::matmul(x, w1.t()), w2.t()), w3.t()); }
  at::Tensor w1, w2, w3;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_THREAD_RANKS_H_
