#include "worker/ddp/shared_memory_all_reduce.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/contract/testing/temp_dir.h"

namespace fitrun::worker {
namespace {

using Group = std::vector<std::unique_ptr<SharedMemoryAllReduce>>;

SharedMemoryAllReduce::Options OptionsFor(int rank, int world, int64_t slot_bytes = 1 << 20,
                                          absl::Duration timeout = absl::Seconds(10)) {
  SharedMemoryAllReduce::Options options;
  options.rank = rank;
  options.world_size = world;
  options.slot_bytes = slot_bytes;
  options.timeout = timeout;
  return options;
}

// Rank 0's segment and every other rank's view of it, in one process.
Group MakeGroup(int world, int64_t slot_bytes = 1 << 20, absl::Duration timeout = absl::Seconds(10)) {
  Group group;
  auto first = SharedMemoryAllReduce::Create(OptionsFor(0, world, slot_bytes, timeout));
  EXPECT_TRUE(first.ok()) << first.status();
  if (!first.ok()) return group;
  const std::string name = (*first)->name();
  const uint64_t nonce = (*first)->nonce();
  group.push_back(*std::move(first));
  for (int rank = 1; rank < world; ++rank) {
    auto peer = SharedMemoryAllReduce::Open(name, nonce, OptionsFor(rank, world, slot_bytes, timeout));
    EXPECT_TRUE(peer.ok()) << peer.status();
    if (!peer.ok()) return {};
    group.push_back(*std::move(peer));
  }
  group[0]->Unlink();
  return group;
}

// Rank r's value at i: integers small enough that every sum is exact in float32.
float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 1000 + i % 997); }

// Each rank on a thread of its own sums `count` elements `repeats` times; checks every result.
void SumOnThreads(Group& group, int64_t count, int repeats) {
  const int world = static_cast<int>(group.size());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      for (int repeat = 0; repeat < repeats; ++repeat) {
        std::vector<float> data(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) data[i] = Value(rank, i) + repeat;
        ASSERT_TRUE(group[rank]->Sum(data.data(), count).ok());
        for (int64_t i = 0; i < count; ++i) {
          float expected = 0;
          for (int r = 0; r < world; ++r) expected += Value(r, i) + repeat;
          ASSERT_EQ(data[i], expected) << "rank " << rank << " element " << i << " of " << count;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(SharedMemoryAllReduceTest, SumsEveryLengthAcrossWorldSizes) {
  for (int world : {2, 3, 4}) {
    Group group = MakeGroup(world);
    ASSERT_EQ(group.size(), static_cast<size_t>(world));
    for (int64_t count : {0, 1, 5, 1000, 70001}) SumOnThreads(group, count, 3);
  }
}

TEST(SharedMemoryAllReduceTest, ArraysLongerThanASlotGoInChunks) {
  // 64-byte slots hold 16 floats: 1,000 elements are 63 chunks, alternating between the two slot sets.
  Group group = MakeGroup(3, /*slot_bytes=*/64);
  SumOnThreads(group, 1000, 4);
  SumOnThreads(group, 16, 2);
  SumOnThreads(group, 17, 2);
}

TEST(SharedMemoryAllReduceTest, SumsDoubles) {
  Group group = MakeGroup(2, /*slot_bytes=*/128);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<double> data(100, rank == 0 ? 0.25 : 1e-17);
      ASSERT_TRUE(group[rank]->Sum(data.data(), 100).ok());
      for (double v : data) EXPECT_EQ(v, 0.25 + 1e-17);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(SharedMemoryAllReduceTest, OpenChecksTheSegmentIsRankZeros) {
  auto first = SharedMemoryAllReduce::Create(OptionsFor(0, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string name = (*first)->name();
  EXPECT_EQ(SharedMemoryAllReduce::Open(name, (*first)->nonce() + 1, OptionsFor(1, 2)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(SharedMemoryAllReduce::Open(name, (*first)->nonce(), OptionsFor(1, 3)).ok()) << "another world size";
  EXPECT_FALSE(SharedMemoryAllReduce::Open(name, (*first)->nonce(), OptionsFor(1, 2, 1 << 10)).ok())
      << "another slot size";
  EXPECT_TRUE(SharedMemoryAllReduce::Open(name, (*first)->nonce(), OptionsFor(1, 2)).ok());
  (*first)->Unlink();
  EXPECT_FALSE(SharedMemoryAllReduce::Open(name, (*first)->nonce(), OptionsFor(1, 2)).ok()) << "unlinked";
  EXPECT_FALSE(SharedMemoryAllReduce::Open("fitrun-allreduce-none", 0, OptionsFor(1, 2)).ok());
  EXPECT_EQ(SharedMemoryAllReduce::Open("../etc/passwd", 0, OptionsFor(1, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(SharedMemoryAllReduce::Create(OptionsFor(2, 2)).ok()) << "rank outside the world";
  EXPECT_FALSE(SharedMemoryAllReduce::Create(OptionsFor(0, SharedMemoryAllReduce::kMaxRanks + 1)).ok());
}

TEST(SharedMemoryAllReduceTest, TheSegmentIsThisUsersOnlyAndGoneWithRankZero) {
  std::string name;
  {
    auto first = SharedMemoryAllReduce::Create(OptionsFor(0, 2));
    ASSERT_TRUE(first.ok()) << first.status();
    name = (*first)->name();
    struct stat st {};
    ASSERT_EQ(lstat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_uid, geteuid());
  }
  // Rank 0 that never saw its peers open the segment removes its name as it goes.
  struct stat st {};
  EXPECT_NE(lstat(("/dev/shm/" + name).c_str(), &st), 0);
}

// The group's store, for ranks that are threads: a map, and Get waits for its key.
class MapRendezvous : public SharedMemoryAllReduce::Rendezvous {
 public:
  void Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    set_.notify_all();
  }
  std::string Get(const std::string& key) override {
    std::unique_lock<std::mutex> lock(mu_);
    set_.wait(lock, [&] { return values_.count(key) > 0; });
    return values_[key];
  }
  int64_t Add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_[key] += delta;
  }

 private:
  std::mutex mu_;
  std::condition_variable set_;
  std::map<std::string, std::string> values_;
  std::map<std::string, int64_t> counters_;
};

// Each rank joins on a thread of its own, in `directories[rank]`.
std::vector<absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>>> JoinOnThreads(
    const std::vector<std::string>& directories) {
  const int world = static_cast<int>(directories.size());
  MapRendezvous rendezvous;
  std::vector<absl::StatusOr<std::unique_ptr<SharedMemoryAllReduce>>> joined;
  for (int rank = 0; rank < world; ++rank) joined.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      SharedMemoryAllReduce::Options options = OptionsFor(rank, world, 1 << 16, absl::Seconds(10));
      options.directory = directories[rank];
      joined[rank] = SharedMemoryAllReduce::Join(rendezvous, "group/", options);
    });
  }
  for (auto& t : threads) t.join();
  return joined;
}

bool IsEmptyDirectory(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return false;
  int entries = 0;
  while (dirent* entry = readdir(dir)) {
    if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..") ++entries;
  }
  closedir(dir);
  return entries == 0;
}

TEST(SharedMemoryAllReduceJoinTest, RanksOfOneMachineShareTheSegmentAndItsNameIsGone) {
  const contract::TempDir machine_dir("one-machine-");
  ASSERT_TRUE(machine_dir.ok());
  const std::string& machine = machine_dir.path();
  auto joined = JoinOnThreads({machine, machine, machine});
  Group group;
  for (auto& j : joined) {
    ASSERT_TRUE(j.ok()) << j.status();
    group.push_back(*std::move(j));
  }
  EXPECT_TRUE(IsEmptyDirectory(machine)) << "the segment's name outlived the join";
  SumOnThreads(group, 50000, 2);
}

TEST(SharedMemoryAllReduceJoinTest, ARankOnAnotherMachineSendsEveryRankBackToItsOtherTransport) {
  const contract::TempDir first_dir("machine-a-");
  const contract::TempDir second_dir("machine-b-");
  ASSERT_TRUE(first_dir.ok() && second_dir.ok());
  const std::string& first = first_dir.path();
  const std::string& second = second_dir.path();
  auto joined = JoinOnThreads({first, first, second});
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(joined[rank].status().code(), absl::StatusCode::kUnavailable) << "rank " << rank;
    EXPECT_NE(joined[rank].status().message().find("2 of 3 ranks could map the segment"), std::string::npos)
        << joined[rank].status();
  }
  EXPECT_NE(joined[2].status().message().find("No such file"), std::string::npos) << joined[2].status();
  EXPECT_TRUE(IsEmptyDirectory(first));
  EXPECT_TRUE(IsEmptyDirectory(second));
}

TEST(SharedMemoryAllReduceJoinTest, NoSegmentFromRankZeroMeansNoneForAnyone) {
  // Rank 0's directory does not exist: it cannot create, and says so with an empty name.
  const contract::TempDir machine_dir("machine-c-");
  ASSERT_TRUE(machine_dir.ok());
  const std::string& machine = machine_dir.path();
  auto joined = JoinOnThreads({machine + "/missing", machine});
  EXPECT_EQ(joined[0].status().code(), absl::StatusCode::kUnavailable) << joined[0].status();
  EXPECT_NE(joined[1].status().message().find("rank 0 could not create"), std::string::npos) << joined[1].status();
}

TEST(SharedMemoryAllReduceTest, APeerThatLeftFailsTheSumAtOnce) {
  Group group = MakeGroup(2, 1 << 20, /*timeout=*/absl::Seconds(30));
  ASSERT_EQ(group.size(), 2u);
  std::thread leaver([&] {
    absl::SleepFor(absl::Milliseconds(100));
    group[1].reset();
  });
  const absl::Time start = absl::Now();
  std::vector<float> data(10, 1.0f);
  absl::Status status = group[0]->Sum(data.data(), 10);
  leaver.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("rank 1 left"), std::string::npos) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The group is not usable afterwards: later sums fail without waiting.
  EXPECT_EQ(group[0]->Sum(data.data(), 10).code(), absl::StatusCode::kUnavailable);
}

TEST(SharedMemoryAllReduceTest, AStalledPeerTimesOut) {
  Group group = MakeGroup(2, 1 << 20, /*timeout=*/absl::Milliseconds(300));
  ASSERT_EQ(group.size(), 2u);
  const absl::Time start = absl::Now();
  std::vector<float> data(10, 1.0f);
  absl::Status status = group[0]->Sum(data.data(), 10);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Processes, not threads: the progress words are waited on across address spaces.
TEST(SharedMemoryAllReduceTest, RanksInSeparateProcesses) {
  constexpr int kWorld = 3;
  constexpr int64_t kCount = 300000;  // five chunks of 256 KiB
  auto first = SharedMemoryAllReduce::Create(OptionsFor(0, kWorld, 256 << 10));
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<pid_t> children;
  for (int rank = 1; rank < kWorld; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto peer = SharedMemoryAllReduce::Open((*first)->name(), (*first)->nonce(), OptionsFor(rank, kWorld, 256 << 10));
      if (!peer.ok()) _exit(2);
      for (int repeat = 0; repeat < 20; ++repeat) {
        std::vector<float> data(kCount);
        for (int64_t i = 0; i < kCount; ++i) data[i] = Value(rank, i);
        if (!(*peer)->Sum(data.data(), kCount).ok()) _exit(3);
        for (int64_t i = 0; i < kCount; ++i) {
          if (data[i] != Value(0, i) + Value(1, i) + Value(2, i)) _exit(4);
        }
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  for (int repeat = 0; repeat < 20; ++repeat) {
    std::vector<float> data(kCount);
    for (int64_t i = 0; i < kCount; ++i) data[i] = Value(0, i);
    ASSERT_TRUE((*first)->Sum(data.data(), kCount).ok());
    for (int64_t i = 0; i < kCount; i += 997) ASSERT_EQ(data[i], Value(0, i) + Value(1, i) + Value(2, i));
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit status " << status;
  }
}

TEST(SharedMemoryAllReduceTest, APeerProcessKilledFailsTheSum) {
  auto first = SharedMemoryAllReduce::Create(OptionsFor(0, 2, 1 << 20, absl::Seconds(30)));
  ASSERT_TRUE(first.ok()) << first.status();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto peer = SharedMemoryAllReduce::Open((*first)->name(), (*first)->nonce(), OptionsFor(1, 2));
    if (!peer.ok()) _exit(2);
    (void)!write(ready[1], "x", 1);
    pause();  // killed here, its object never destroyed
    _exit(0);
  }
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // Not collected yet: a zombie counts as gone.
  const absl::Time start = absl::Now();
  std::vector<float> data(10, 1.0f);
  absl::Status status = (*first)->Sum(data.data(), 10);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("exited"), std::string::npos) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  int wait_status = 0;
  waitpid(pid, &wait_status, 0);
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace fitrun::worker
