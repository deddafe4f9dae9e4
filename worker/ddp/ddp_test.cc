// Two ranks as two threads of one process, as PyTorch's ProcessGroupGlooTest does.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <cstdio>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/flat_all_reduce.h"
#include "proto/contract/free_port.h"
#include "worker/ddp/process_group.h"
#include "worker/ddp/shared_memory_backend.h"
#include "worker/ddp/thread_ranks.h"

namespace fitrun::worker {
namespace {

constexpr int kWorld = 2;
const absl::Duration kTimeout = absl::Seconds(10);

void RunRanks(const std::string& store_name,
              const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& body,
              absl::Duration timeout = kTimeout) {
  RunRanksAsThreads(kWorld, store_name, body, timeout);
}

struct TwoParameters : torch::nn::Module {
  explicit TwoParameters(float value) {
    a = register_parameter("a", at::full({2, 3}, value));
    b = register_parameter("b", at::full({4}, -value));
  }
  at::Tensor a;
  at::Tensor b;
};

TEST(FlatAllReduceTest, AveragesGradientsAndLoss) {
  RunRanks("allreduce_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    TwoParameters module(0.0f);
    module.a.mutable_grad() = at::full({2, 3}, static_cast<float>(rank + 1));
    // Rank 0's backward never reached b: it counts as a zero gradient.
    if (rank == 1) module.b.mutable_grad() = at::full({4}, 4.0f);

    auto synchronizer = FlatAllReduceSynchronizer::Create(group, module.parameters());
    ASSERT_TRUE(synchronizer.ok()) << synchronizer.status();
    (*synchronizer)->BeforeBackward(true);
    absl::StatusOr<double> loss = (*synchronizer)->Synchronize(rank == 0 ? 1.0 : 2.0);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_DOUBLE_EQ(*loss, 1.5);
    EXPECT_TRUE(at::equal(module.a.grad(), at::full({2, 3}, 1.5f))) << module.a.grad();
    EXPECT_TRUE(at::equal(module.b.grad(), at::full({4}, 2.0f))) << module.b.grad();

    // The buffer is reused: a second step must not see the first one's values.
    module.a.mutable_grad().fill_(static_cast<float>(10 * rank));
    module.b.mutable_grad().fill_(0.0f);
    loss = (*synchronizer)->Synchronize(0.0);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_DOUBLE_EQ(*loss, 0.0);
    EXPECT_TRUE(at::equal(module.a.grad(), at::full({2, 3}, 5.0f))) << module.a.grad();
  });
}

TEST(FlatAllReduceTest, DeadPeerFailsWithAStatus) {
  const absl::Time start = absl::Now();
  RunRanks(
      "dead_peer_store",
      [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
        if (rank == 1) return;  // leaves, dropping its end of the group
        TwoParameters module(0.0f);
        auto synchronizer = FlatAllReduceSynchronizer::Create(group, module.parameters());
        ASSERT_TRUE(synchronizer.ok()) << synchronizer.status();
        absl::StatusOr<double> loss = (*synchronizer)->Synchronize(1.0);
        EXPECT_FALSE(loss.ok());
      },
      absl::Seconds(3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
}

TEST(BroadcastTest, EveryRankEndsWithRankZerosParameters) {
  RunRanks("broadcast_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    TwoParameters module(rank == 0 ? 3.0f : 7.0f);
    ASSERT_TRUE(BroadcastModuleState(*group, module).ok());
    EXPECT_TRUE(at::equal(module.a, at::full({2, 3}, 3.0f))) << "rank " << rank;
    EXPECT_TRUE(at::equal(module.b, at::full({4}, -3.0f))) << "rank " << rank;
    // Still trainable leaves after the in-place copy.
    EXPECT_TRUE(module.a.requires_grad());
  });
}

// Sums over the group's shared memory or over Gloo's sockets, as `shared_memory` asks: the same
// results either way, for the tensors shared memory carries and for those it leaves to Gloo.
void RendezvousAndSum(bool shared_memory) {
  SkipUnlessCpuRanks(kWorld);
  const int port = fitrun::contract::PickFreeLoopbackPort().value();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([port, rank, shared_memory] {
      ProcessGroupOptions options{"127.0.0.1", port, rank, kWorld, kTimeout, kTimeout};
      options.shared_memory_all_reduce = shared_memory;
      auto group = ConnectProcessGroup(options);
      ASSERT_TRUE(group.ok()) << group.status();
      EXPECT_EQ(SumsInSharedMemory(**group), shared_memory);
      std::vector<at::Tensor> t = {at::full({3}, static_cast<float>(rank + 1))};
      (*group)->allreduce(t)->wait();
      EXPECT_TRUE(at::equal(t[0], at::full({3}, 3.0f)));
      std::vector<at::Tensor> d = {at::full({70000}, 0.5 + rank, at::kDouble)};
      (*group)->allreduce(d)->wait();
      EXPECT_TRUE(at::equal(d[0], at::full({70000}, 2.0, at::kDouble)));
      // Not a sum, not float: Gloo's in both cases.
      std::vector<at::Tensor> m = {at::full({2}, static_cast<float>(rank))};
      c10d::AllreduceOptions max;
      max.reduceOp = c10d::ReduceOp::MAX;
      (*group)->allreduce(m, max)->wait();
      EXPECT_TRUE(at::equal(m[0], at::full({2}, 1.0f)));
      std::vector<at::Tensor> n = {at::full({2}, int64_t{rank + 5}, at::kLong)};
      (*group)->allreduce(n)->wait();
      EXPECT_TRUE(at::equal(n[0], at::full({2}, int64_t{11}, at::kLong)));
    });
  }
  for (auto& t : threads) t.join();
}

TEST(ConnectProcessGroupTest, RendezvousOverTcpStoreSumsThroughSharedMemory) { RendezvousAndSum(true); }

TEST(ConnectProcessGroupTest, RendezvousOverTcpStoreSumsOverGlooWhenAsked) { RendezvousAndSum(false); }

// A sum through shared memory runs on the training thread, inside the hook that starts it (in
// backward, or in Synchronize for the last bucket), not in the wait: the reducer counts it as exposed
// communication all the same. Rank 1 comes late, so rank 0's sum waits for it.
TEST(ConnectProcessGroupTest, ASharedMemorySumIsExposedCommunication) {
  SkipUnlessCpuRanks(kWorld);
  const int port = fitrun::contract::PickFreeLoopbackPort().value();
  const absl::Duration late = absl::Milliseconds(300);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([port, rank, late] {
      ProcessGroupOptions options{"127.0.0.1", port, rank, kWorld, kTimeout, kTimeout};
      options.shared_memory_all_reduce = true;
      auto group = ConnectProcessGroup(options);
      ASSERT_TRUE(group.ok()) << group.status();
      ASSERT_TRUE(SumsInSharedMemory(**group));
      TwoParameters module(1.0f + rank);
      auto reducer = BucketedReducer::Create(*group, module.parameters(), BucketedReducer::Options());
      ASSERT_TRUE(reducer.ok()) << reducer.status();
      (*reducer)->BeforeBackward(true);
      (module.a.sum() + module.b.sum()).backward();
      if (rank == 1) absl::SleepFor(late);
      ASSERT_TRUE((*reducer)->Synchronize(1.0).ok());
      const BucketedReducer::CommStats stats = (*reducer)->comm_stats();
      EXPECT_EQ(stats.exposed(), stats.start_time + stats.wait_time);
      EXPECT_EQ((*reducer)->ExposedCommunication(), stats.exposed());
      if (rank == 0) {
        EXPECT_GE(stats.start_time, late / 2) << "the sum waited for rank 1 on the training thread";
        EXPECT_LT(stats.wait_time, late / 2) << "and its work was done when Synchronize waited";
      }
    });
  }
  for (auto& t : threads) t.join();
}

// A peer that leaves while the other waits in a shared-memory sum: the survivor's wait throws, as
// Gloo's does for a closed connection, and the group refuses every later sum.
TEST(FlatAllReduceTest, APeerLeavingDuringASharedMemorySumFailsIt) {
  RunRanks(
      "leaving_peer_store",
      [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
        ASSERT_TRUE(SumsInSharedMemory(*group));
        if (rank == 1) {
          absl::SleepFor(absl::Milliseconds(200));
          return;  // its group, and the segment's rank 1, go with it
        }
        const absl::Time start = absl::Now();
        TwoParameters module(0.0f);
        auto synchronizer = FlatAllReduceSynchronizer::Create(group, module.parameters());
        ASSERT_TRUE(synchronizer.ok()) << synchronizer.status();
        absl::StatusOr<double> loss = (*synchronizer)->Synchronize(1.0);
        EXPECT_EQ(loss.status().code(), absl::StatusCode::kUnavailable) << loss.status();
        EXPECT_TRUE(absl::StrContains(loss.status().message(), "rank 1 left")) << loss.status();
        EXPECT_LT(absl::Now() - start, absl::Seconds(2));
        EXPECT_FALSE((*synchronizer)->Synchronize(1.0).ok());
      },
      absl::Seconds(30));
}

TEST(ConnectProcessGroupTest, MissingPeerTimesOutWithAStatus) {
  ProcessGroupOptions options{"127.0.0.1", fitrun::contract::PickFreeLoopbackPort().value(), 0, kWorld, absl::Milliseconds(500), kTimeout};
  auto group = ConnectProcessGroup(options);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
  EXPECT_TRUE(absl::StrContains(group.status().message(), "only 1 of 2 ranks joined")) << group.status();
}

TEST(ConnectProcessGroupTest, RejectsBadRankAndPort) {
  EXPECT_EQ(ConnectProcessGroup({"127.0.0.1", 1234, 2, 2, kTimeout, kTimeout}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectProcessGroup({"127.0.0.1", 0, 0, 2, kTimeout, kTimeout}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SingleRankGroupTest, EachCollectiveIsWhatItIsOverOneRank) {
  c10::intrusive_ptr<c10d::ProcessGroup> group = CreateSingleRankProcessGroup();
  EXPECT_EQ(group->getRank(), 0);
  EXPECT_EQ(group->getSize(), 1);
  std::vector<at::Tensor> summed = {at::arange(4, at::kFloat)};
  group->allreduce(summed)->wait();
  EXPECT_TRUE(at::equal(summed[0], at::arange(4, at::kFloat)));
  std::vector<at::Tensor> broadcast = {at::full({2}, 7.0f)};
  group->broadcast(broadcast)->wait();
  EXPECT_TRUE(at::equal(broadcast[0], at::full({2}, 7.0f)));
  std::vector<at::Tensor> inputs = {at::full({3}, 5.0f)};
  std::vector<std::vector<at::Tensor>> outputs = {{at::zeros({3})}};
  group->allgather(outputs, inputs)->wait();
  EXPECT_TRUE(at::equal(outputs[0][0], at::full({3}, 5.0f))) << "an all-gather over one rank is a copy";
  group->barrier()->wait();
  EXPECT_EQ(*BroadcastInt64(*group, 42, at::Device(at::kCPU)), 42);
}

TEST(SingleRankGroupTest, ACpuRankAloneNeedsNoGlooAndSeveralDo) {
  EXPECT_EQ(BackendFor(/*on_cuda=*/false, /*shares_its_gpu=*/false, 1), CollectiveBackend::kSingleRank);
  EXPECT_EQ(BackendFor(false, false, 2), CollectiveBackend::kGloo);
  EXPECT_EQ(BackendFor(true, false, 1), CollectiveBackend::kNccl);
  EXPECT_EQ(BackendFor(true, true, 2), CollectiveBackend::kGloo) << "NCCL refuses two ranks on one GPU";
  EXPECT_TRUE(CollectiveBackendAvailable(CollectiveBackend::kSingleRank).ok());
  // No rendezvous: no port to bind, no peer to wait for.
  auto alone = ConnectProcessGroup({"127.0.0.1", 0, 0, 1, kTimeout, kTimeout, CollectiveBackend::kSingleRank});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ((*alone)->getSize(), 1);
  EXPECT_EQ(ConnectProcessGroup({"127.0.0.1", 0, 0, 2, kTimeout, kTimeout, CollectiveBackend::kSingleRank})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fitrun::worker
