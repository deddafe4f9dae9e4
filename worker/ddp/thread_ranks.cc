#include "worker/ddp/thread_ranks.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/version.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"
#include "worker/ddp/process_group.h"

namespace fitrun::worker {
namespace {

// One rank's group is the worker's own single-rank group, in every build; several ranks talk over Gloo.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                                   int rank, int world, absl::Duration timeout) {
  if (world == 1) return CreateSingleRankProcessGroup();
  return CreateGlooProcessGroup(store, rank, world, timeout);
}

}  // namespace

bool CpuRanksAvailable(int world) {
#if defined(USE_C10D_GLOO)
  return world >= 1;
#else
  return world == 1;
#endif
}

void SkipUnlessCpuRanks(int world) {
  if (CpuRanksAvailable(world)) return;
  [world] { GTEST_SKIP() << kNoCpuRanksReason << " (this test needs " << world << ")"; }();
  throw ::testing::AssertionException(
      ::testing::TestPartResult(::testing::TestPartResult::kSkip, __FILE__, __LINE__, kNoCpuRanksReason));
}

std::string FreshTestPath(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(root != nullptr ? root : "/tmp") + "/" + name;
  std::remove(path.c_str());
  return path;
}

void RunRanksAsThreads(int world, const std::string& store_name,
                       const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& body,
                       absl::Duration timeout) {
  SkipUnlessCpuRanks(world);
  // As in the worker's main: a rank that leaves (a dead-peer test) makes Gloo's next write to it fail
  // with EPIPE, which the surviving rank must see as a failed collective, not die of SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  const std::string path = FreshTestPath(store_name);
  // Every rank's group is complete before any body runs: a body that leaves at once (a dead peer)
  // must not close its connections while another rank is still finishing the handshake.
  absl::Barrier groups_ready(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto store = c10::make_intrusive<c10d::FileStore>(path, world);
      auto group = CreateGroup(store, rank, world, timeout);
      groups_ready.Block();
      ASSERT_TRUE(group.ok()) << group.status();
      body(rank, *group);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace fitrun::worker
