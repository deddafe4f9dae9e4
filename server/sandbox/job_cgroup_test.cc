// JobCgroup: where the hierarchies are (mountinfo as several machines write it), the v2 file
// writing against a fake tree laid out as the kernel would, and the real behaviour on this machine's
// cgroups as root (skipped, saying why, otherwise): limits read back, processes listed, a
// double-forked setsid sleeper killed, pids.max stopping a fork loop, a memory hog OOM-killed and
// counted, a restarted coordinator finding its cgroup, and nothing left behind.
#include "server/sandbox/job_cgroup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/sandbox/throwaway_cgroups.h"
#include "server/spawn/spawn.h"
#include "server/testing/read_file.h"
#include "server/testing/wait.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

void Put(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

// This machine's layout: cgroup v1 controllers, fitrund's memory cgroup nested, and a cgroup2 mount
// with no controllers beside them.
constexpr char kHybridMountinfo[] =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
constexpr char kHybridSelf[] =
    "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/process_api/2e75\n1:cpu,cpuacct:/\n0::/\n";

TEST(CgroupMountsTest, ReadsV1ControllersAndWhereThisProcessSits) {
  const CgroupMounts mounts = ParseCgroupMounts(kHybridMountinfo, kHybridSelf);
  EXPECT_EQ(mounts.unified_mount, "/sys/fs/cgroup/unified");
  EXPECT_EQ(mounts.v1_mounts.at("memory"), "/sys/fs/cgroup/memory");
  EXPECT_EQ(mounts.v1_mounts.at("pids"), "/sys/fs/cgroup/pids");
  EXPECT_EQ(mounts.v1_mounts.count("systemd"), 0u);
  EXPECT_EQ(mounts.v1_own.at("memory"), "/process_api/2e75");
  EXPECT_EQ(mounts.v1_own.at("pids"), "/");
  EXPECT_EQ(mounts.v1_own.at("cpuacct"), "/");
}

TEST(CgroupMountsTest, ReadsAUnifiedHierarchyAndAContainersBindMountedRoot) {
  const CgroupMounts v2 = ParseCgroupMounts("30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
                                            "0::/system.slice/fitrund.service\n");
  EXPECT_EQ(v2.unified_mount, "/sys/fs/cgroup");
  EXPECT_EQ(v2.unified_own, "/system.slice/fitrund.service");
  EXPECT_TRUE(v2.v1_mounts.empty());
  // Seen through a mount of the container's own cgroup (no cgroup namespace): paths are relative to it.
  const CgroupMounts contained =
      ParseCgroupMounts("500 400 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/docker/abc/work\n");
  EXPECT_EQ(contained.unified_own, "/work");
  // Spaces in a mount point are escaped as octal.
  const CgroupMounts spaced = ParseCgroupMounts("1 2 0:1 / /my\\040cgroups rw - cgroup2 none rw\n", "0::/\n");
  EXPECT_EQ(spaced.unified_mount, "/my cgroups");
}

// ---- cgroup v2, against a fake tree ----

// A unified hierarchy as the kernel would show it: the root offers memory and pids; fitrund sits in
// fitrund.slice; the levels fitrund makes are there already with their interface files (a plain
// directory has none, and cgroup files are never created by writing).
class FakeUnifiedTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (std::filesystem::path(::testing::TempDir()) / absl::StrCat("fake-cgroup2-", getpid())).string();
    std::filesystem::remove_all(root_);
    Put(root_ + "/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n");
    Put(root_ + "/self", "0::/fitrund.slice\n");
    MakeLevel(cgroup_, "cpu io memory pids");
    MakeLevel(cgroup_ + "/fitrund.slice", "memory pids");
    MakeLevel(cgroup_ + "/fitrund.slice/fitrun", "memory pids");
    MakeLevel(tag_dir(), "memory pids");
    const std::string attempt = tag_dir() + "/j-000001-a1";
    MakeLevel(attempt, "memory pids");
    for (const char* file : {"memory.max", "memory.swap.max", "pids.max"}) Put(attempt + "/" + file, "max\n");
    Put(attempt + "/cgroup.kill", "");
    Put(attempt + "/memory.events", "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n");
    Put(attempt + "/memory.peak", "123456\n");
    options_.coordinator_tag = "fitrund-0123";
    options_.mountinfo_path = root_ + "/mountinfo";
    options_.self_cgroup_path = root_ + "/self";
    options_.root_prefix = root_ + "/tree";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void MakeLevel(const std::string& dir, const std::string& offered) {
    Put(dir + "/cgroup.controllers", offered + "\n");
    Put(dir + "/cgroup.subtree_control", "");
    Put(dir + "/cgroup.procs", "");
    Put(dir + "/cgroup.events", "populated 0\nfrozen 0\n");
  }
  std::string tag_dir() const { return cgroup_ + "/fitrund.slice/fitrun/fitrund-0123"; }

  std::string root_ = "/nonexistent";
  std::string cgroup_ = (std::filesystem::path(::testing::TempDir()) /
                         absl::StrCat("fake-cgroup2-", getpid(), "/tree/sys/fs/cgroup"))
                            .string();
  JobCgroups::Options options_;
};

TEST_F(FakeUnifiedTreeTest, MakesTheAttemptsCgroupWithItsLimitsUnderFitrundsOwn) {
  absl::StatusOr<std::unique_ptr<JobCgroups>> cgroups = JobCgroups::Create(options_);
  ASSERT_TRUE(cgroups.ok()) << cgroups.status();
  EXPECT_EQ((*cgroups)->version(), CgroupVersion::kV2);
  EXPECT_THAT((*cgroups)->Describe(), HasSubstr("cgroup v2 (memory, pids)"));
  EXPECT_THAT((*cgroups)->Describe(), HasSubstr("fitrund.slice/fitrun/fitrund-0123"));
  // Each level lets the one below have memory and pids.
  for (const std::string& level : {cgroup_ + "/fitrund.slice", cgroup_ + "/fitrund.slice/fitrun", tag_dir()}) {
    EXPECT_EQ(ReadFileForTest(level + "/cgroup.subtree_control"), "+memory +pids") << level;
  }

  absl::StatusOr<std::unique_ptr<JobCgroup>> attempt =
      (*cgroups)->Make(AttemptCgroupName("j-000001", 1), {int64_t{3} << 30, 1024});
  ASSERT_TRUE(attempt.ok()) << attempt.status();
  const std::string dir = tag_dir() + "/j-000001-a1";
  EXPECT_EQ(ReadFileForTest(dir + "/memory.max"), "3221225472");
  EXPECT_EQ(ReadFileForTest(dir + "/memory.swap.max"), "0") << "swap does not stretch the limit";
  EXPECT_EQ(ReadFileForTest(dir + "/pids.max"), "1024");
  EXPECT_EQ((*attempt)->ProcsFiles(), std::vector<std::string>{dir + "/cgroup.procs"});
  absl::StatusOr<CgroupLimits> limits = (*attempt)->ReadLimits();
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->memory_bytes, int64_t{3} << 30);
  EXPECT_EQ(limits->max_tasks, 1024);

  absl::StatusOr<HostMemoryStats> memory = (*attempt)->HostMemory();
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->oom_kills, 1);
  EXPECT_EQ(memory->peak_bytes, 123456);
  EXPECT_EQ(memory->limit_bytes, int64_t{3} << 30);

  EXPECT_EQ((*cgroups)->List(), std::vector<std::string>{"j-000001-a1"});
  ASSERT_TRUE((*cgroups)->Open("j-000001-a1").ok());
  EXPECT_TRUE(absl::IsNotFound((*cgroups)->Open("j-000001-a2").status()));
}

TEST_F(FakeUnifiedTreeTest, KillAllWritesCgroupKillAndWaitsUntilTheCgroupIsEmpty) {
  absl::StatusOr<std::unique_ptr<JobCgroups>> cgroups = JobCgroups::Create(options_);
  ASSERT_TRUE(cgroups.ok()) << cgroups.status();
  absl::StatusOr<std::unique_ptr<JobCgroup>> attempt = (*cgroups)->Open("j-000001-a1");
  ASSERT_TRUE(attempt.ok()) << attempt.status();
  const std::string dir = tag_dir() + "/j-000001-a1";
  Put(dir + "/cgroup.procs", "4242\n4243\n");
  // The kernel's part: once cgroup.kill says 1, the processes go.
  std::atomic<bool> stop{false};
  std::thread kernel([&] {
    while (!stop && ReadFileForTest(dir + "/cgroup.kill") != "1") absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(50));
    Put(dir + "/cgroup.procs", "");
  });
  const absl::Status killed = (*attempt)->KillAll(absl::Seconds(5));
  stop = true;
  kernel.join();
  EXPECT_TRUE(killed.ok()) << killed;
  EXPECT_EQ(ReadFileForTest(dir + "/cgroup.kill"), "1");

  // One that never empties is reported with the file and what is left.
  Put(dir + "/cgroup.procs", "4242\n");
  const absl::Status stuck = (*attempt)->KillAll(absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(stuck)) << stuck;
  EXPECT_THAT(stuck.message(), HasSubstr(dir + "/cgroup.procs"));
  EXPECT_THAT(stuck.message(), HasSubstr("4242"));
}

TEST_F(FakeUnifiedTreeTest, AHierarchyWithoutMemoryAndPidsIsRefusedSayingWhy) {
  // fitrund's cgroup is not given memory by the levels above it.
  Put(cgroup_ + "/fitrund.slice/cgroup.controllers", "cpu io\n");
  absl::StatusOr<std::unique_ptr<JobCgroups>> refused = JobCgroups::Create(options_);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(cgroup_ + "/fitrund.slice/cgroup.controllers"));
  EXPECT_THAT(refused.status().message(), HasSubstr("does not offer memory and pids"));

  // A hybrid machine whose cgroup2 has no controllers and no v1 memory either.
  Put(root_ + "/mountinfo", "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  Put(cgroup_ + "/cgroup.controllers", "hugetlb\n");
  const CgroupSupport none = ProbeCgroupSupport(options_);
  EXPECT_EQ(none.cgroups, nullptr);
  EXPECT_THAT(none.text, HasSubstr("no cgroup hierarchy with the memory and pids controllers"));
  EXPECT_THAT(none.text, HasSubstr("offers 'hugetlb'"));

  options_.mountinfo_path = root_ + "/missing";
  EXPECT_THAT(ProbeCgroupSupport(options_).text, HasSubstr(root_ + "/missing"));
}

// ---- this machine's cgroups, as root ----

class RealCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!throwaway_.available()) GTEST_SKIP() << throwaway_.why();
    dir_ = (std::filesystem::path(::testing::TempDir()) / absl::StrCat("real-cgroup-", getpid())).string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!throwaway_.available()) return;
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      Reap(pid);
    }
    EXPECT_EQ(throwaway_.Leftovers(), std::vector<std::string>{}) << "a test left a cgroup behind";
    throwaway_.Clear();
    std::filesystem::remove_all(dir_);
  }

  // A child in `cgroup`, running `script` under /bin/sh with its output in <dir>/<name>.log.
  pid_t Start(const JobCgroup& cgroup, const std::string& script, const std::string& name = "child") {
    SpawnOptions options;
    options.argv = {"/bin/sh", "-c", script};
    options.output_path = absl::StrCat(dir_, "/", name, ".log");
    options.cgroup_procs_files = cgroup.ProcsFiles();
    absl::StatusOr<pid_t> pid = Spawn(options);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return -1;
    children_.push_back(*pid);
    return *pid;
  }
  ChildExit Wait(pid_t pid) {
    children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
    return Reap(pid);
  }

  ThrowawayCgroups throwaway_{"cgroup"};
  std::string dir_;
  std::vector<pid_t> children_;
};

TEST_F(RealCgroupTest, MakesTheCgroupWithItsLimitsAndRemovesIt) {
  absl::StatusOr<std::unique_ptr<JobCgroup>> cgroup = throwaway_.cgroups()->Make("j-000001-a1", {256 << 20, 64});
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  absl::StatusOr<CgroupLimits> limits = (*cgroup)->ReadLimits();
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->memory_bytes, 256 << 20);
  EXPECT_EQ(limits->max_tasks, 64);
  if ((*cgroup)->version() == CgroupVersion::kV1) {
    const std::string memsw = (*cgroup)->directories().front() + "/memory.memsw.limit_in_bytes";
    if (std::filesystem::exists(memsw)) {
      EXPECT_EQ(ReadFileForTest(memsw), absl::StrCat(256 << 20, "\n")) << "swap is bounded too";
    }
  }
  for (const std::string& dir : (*cgroup)->directories()) EXPECT_TRUE(std::filesystem::is_directory(dir)) << dir;
  EXPECT_EQ(throwaway_.cgroups()->List(), std::vector<std::string>{"j-000001-a1"});
  absl::StatusOr<HostMemoryStats> memory = (*cgroup)->HostMemory();
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->oom_kills, 0);
  EXPECT_EQ(memory->limit_bytes, 256 << 20);

  ASSERT_TRUE((*cgroup)->Remove().ok());
  for (const std::string& dir : (*cgroup)->directories()) EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  EXPECT_TRUE(throwaway_.cgroups()->List().empty());
}

TEST_F(RealCgroupTest, KillAllKillsADoubleForkedSetsidSleeperThatTheProcessGroupKillMisses) {
  absl::StatusOr<std::unique_ptr<JobCgroup>> cgroup = throwaway_.cgroups()->Make("j-000002-a1", {});
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  const std::string pid_file = dir_ + "/sleeper.pid";
  // The child leaves a sleeper in a session of its own, its parent gone, then exits.
  const pid_t child = Start(**cgroup, absl::StrCat("setsid /bin/sh -c 'sleep 300 & echo $! > ", pid_file, "' ; exit 0"));
  ASSERT_GT(child, 0);
  EXPECT_EQ(Wait(child).exit_code, 0);
  ASSERT_TRUE(WaitUntil([&] { return !ReadFileForTest(pid_file).empty(); }, absl::Seconds(10)));
  const int sleeper = std::stoi(ReadFileForTest(pid_file));
  ASSERT_FALSE(ProcessGone(sleeper));
  EXPECT_NE(getpgid(sleeper), child) << "the sleeper left the child's process group";
  kill(-child, SIGKILL);  // what stopping the rank's process group does
  absl::StatusOr<std::vector<int>> pids = (*cgroup)->Pids();
  ASSERT_TRUE(pids.ok()) << pids.status();
  EXPECT_EQ(*pids, std::vector<int>{sleeper}) << "only the sleeper is left, and the cgroup knows it";

  ASSERT_TRUE((*cgroup)->KillAll().ok());
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(sleeper); }, absl::Seconds(5)));
  EXPECT_TRUE((*cgroup)->Pids()->empty());
  EXPECT_TRUE((*cgroup)->Remove().ok());
}

TEST_F(RealCgroupTest, PidsMaxStopsAForkLoop) {
  absl::StatusOr<std::unique_ptr<JobCgroup>> cgroup = throwaway_.cgroups()->Make("j-000003-a1", {0, 8});
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  // Forty sleepers asked for; the shell gives up at its first refused fork.
  const pid_t child = Start(**cgroup, "i=0; while [ $i -lt 40 ]; do sleep 300 & i=$((i+1)); done; wait", "forks");
  ASSERT_GT(child, 0);
  const ChildExit exit = Wait(child);
  EXPECT_NE(exit.exit_code, 0) << exit.Describe();
  EXPECT_THAT(ReadFileForTest(dir_ + "/forks.log"), HasSubstr("fork")) << "the shell was refused a fork";
  absl::StatusOr<std::vector<int>> pids = (*cgroup)->Pids();
  ASSERT_TRUE(pids.ok()) << pids.status();
  EXPECT_LE(pids->size(), 8u);
  EXPECT_GE(pids->size(), 2u) << "some sleepers did start";
  ASSERT_TRUE((*cgroup)->KillAll().ok());
  EXPECT_TRUE((*cgroup)->Pids()->empty());
  EXPECT_TRUE((*cgroup)->Remove().ok());
}

TEST_F(RealCgroupTest, AMemoryHogPastTheLimitIsOomKilledAndCounted) {
  absl::StatusOr<std::unique_ptr<JobCgroup>> cgroup = throwaway_.cgroups()->Make("j-000004-a1", {64 << 20, 0});
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  // 512 MiB written, 64 MiB allowed (and no swap beyond it).
  const pid_t child = Start(**cgroup, "exec /usr/bin/python3 -c \"import time; x = b'x' * (512 << 20); time.sleep(60)\"",
                            "hog");
  ASSERT_GT(child, 0);
  const ChildExit exit = Wait(child);
  EXPECT_EQ(exit.signal, SIGKILL) << exit.Describe() << ": " << ReadFileForTest(dir_ + "/hog.log");
  absl::StatusOr<HostMemoryStats> memory = (*cgroup)->HostMemory();
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GE(memory->oom_kills, 1);
  EXPECT_GE(memory->peak_bytes, 48 << 20) << "it was near the limit when killed";
  EXPECT_LE(memory->peak_bytes, 64 << 20);
  EXPECT_EQ(memory->limit_bytes, 64 << 20);
  EXPECT_EQ(*(*cgroup)->HostMemoryOomKills(), memory->oom_kills);
  EXPECT_TRUE((*cgroup)->Remove().ok());
}

TEST_F(RealCgroupTest, ARestartedCoordinatorOpensItsCgroupAndStopsWhatRunsInIt) {
  absl::StatusOr<std::unique_ptr<JobCgroup>> made = throwaway_.cgroups()->Make("j-000005-a3", {256 << 20, 64});
  ASSERT_TRUE(made.ok()) << made.status();
  const pid_t child = Start(**made, "exec sleep 300");
  ASSERT_GT(child, 0);
  made->reset();  // the coordinator that made it is gone

  absl::StatusOr<std::unique_ptr<JobCgroups>> restarted = JobCgroups::Create(throwaway_.options());
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ((*restarted)->List(), std::vector<std::string>{"j-000005-a3"});
  absl::StatusOr<std::unique_ptr<JobCgroup>> opened = (*restarted)->Open("j-000005-a3");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->ReadLimits()->max_tasks, 64);
  ASSERT_TRUE(WaitUntil([&] { return !(*opened)->Pids()->empty(); }, absl::Seconds(5)));
  EXPECT_EQ(*(*opened)->Pids(), std::vector<int>{child});
  ASSERT_TRUE((*opened)->KillAll().ok());
  EXPECT_EQ(Wait(child).signal, SIGKILL);
  EXPECT_TRUE((*opened)->Remove().ok());
  EXPECT_TRUE(absl::IsNotFound((*restarted)->Open("j-000005-a3").status()));
}

TEST_F(RealCgroupTest, MakingAnExistingCgroupEmptiesItFirst) {
  absl::StatusOr<std::unique_ptr<JobCgroup>> first = throwaway_.cgroups()->Make("j-000006-a1", {});
  ASSERT_TRUE(first.ok()) << first.status();
  const pid_t orphan = Start(**first, "exec sleep 300");
  ASSERT_GT(orphan, 0);
  ASSERT_TRUE(WaitUntil([&] { return !(*first)->Pids()->empty(); }, absl::Seconds(5)));
  absl::StatusOr<std::unique_ptr<JobCgroup>> again = throwaway_.cgroups()->Make("j-000006-a1", {128 << 20, 32});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Wait(orphan).signal, SIGKILL);
  EXPECT_EQ((*again)->ReadLimits()->memory_bytes, 128 << 20);
  EXPECT_TRUE((*again)->Remove().ok());
}

TEST_F(RealCgroupTest, ContainsOnlyTheProcessesInIt) {
  absl::StatusOr<std::unique_ptr<JobCgroup>> cgroup = throwaway_.cgroups()->Make("j-000008-a1", {});
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  const pid_t inside = Start(**cgroup, "exec sleep 300");
  ASSERT_TRUE(WaitUntil([&] { return !(*cgroup)->Pids()->empty(); }, absl::Seconds(5)));
  EXPECT_TRUE((*cgroup)->Contains(inside));
  EXPECT_FALSE((*cgroup)->Contains(getpid())) << "the test is in its parent's cgroup, not in this one";
  // Its sibling's process is not in it, though the names differ only in the attempt.
  absl::StatusOr<std::unique_ptr<JobCgroup>> sibling = throwaway_.cgroups()->Make("j-000008-a2", {});
  ASSERT_TRUE(sibling.ok());
  EXPECT_FALSE((*sibling)->Contains(inside));
  ASSERT_TRUE((*cgroup)->KillAll().ok());
  Wait(inside);
  EXPECT_FALSE((*cgroup)->Contains(inside)) << "a pid that is gone is in no cgroup";
  EXPECT_TRUE((*cgroup)->Remove().ok());
  EXPECT_TRUE((*sibling)->Remove().ok());
}

TEST_F(RealCgroupTest, AStartingCoordinatorRemovesTheEmptyCgroupsOfCoordinatorsThatAreGone) {
  // Three others under the same parent: one gone with only empty cgroups left, one gone with a rank
  // still running (for it to re-adopt), one alive.
  auto other = [this](const std::string& tag) {
    JobCgroups::Options options = throwaway_.options();
    options.coordinator_tag = tag;
    return *JobCgroups::Create(options);
  };
  std::unique_ptr<JobCgroups> gone = other("fitrund-00000000000000d1");
  std::unique_ptr<JobCgroups> gone_busy = other("fitrund-00000000000000d2");
  std::unique_ptr<JobCgroups> alive = other("fitrund-00000000000000a1");
  ASSERT_TRUE(gone->Make("j-000001-a1", {}).ok());
  ASSERT_TRUE(gone->Make("j-000002-a1", {}).ok());
  absl::StatusOr<std::unique_ptr<JobCgroup>> busy = gone_busy->Make("j-000003-a1", {});
  ASSERT_TRUE(busy.ok());
  ASSERT_TRUE(gone_busy->Make("j-000004-a1", {}).ok());
  const pid_t rank = Start(**busy, "exec sleep 300");
  ASSERT_TRUE(WaitUntil([&] { return !(*busy)->Pids()->empty(); }, absl::Seconds(5)));
  ASSERT_TRUE(alive->Make("j-000005-a1", {}).ok());
  ASSERT_TRUE(throwaway_.cgroups()->Make("j-000006-a1", {}).ok());

  const std::vector<std::string> removed =
      throwaway_.cgroups()->RemoveGoneCoordinators([](const std::string& tag) { return tag == "fitrund-00000000000000a1"; });
  EXPECT_TRUE(gone->List().empty());
  for (const std::string& dir : gone->directories()) EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  EXPECT_EQ(gone_busy->List(), std::vector<std::string>{"j-000003-a1"}) << "the running rank's cgroup stays";
  EXPECT_EQ(alive->List(), std::vector<std::string>{"j-000005-a1"});
  EXPECT_EQ(throwaway_.cgroups()->List(), std::vector<std::string>{"j-000006-a1"}) << "its own are its own";
  EXPECT_EQ(removed.size(), 4 * gone->directories().size()) << absl::StrJoin(removed, " ");

  // A coordinator whose own directory went meanwhile makes it again for its next attempt.
  ASSERT_TRUE((*alive->Open("j-000005-a1"))->Remove().ok());
  for (const std::string& dir : alive->directories()) ASSERT_EQ(rmdir(dir.c_str()), 0) << dir;
  absl::StatusOr<std::unique_ptr<JobCgroup>> again = alive->Make("j-000007-a1", {64 << 20, 16});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->ReadLimits()->max_tasks, 16);
  EXPECT_TRUE((*again)->Remove().ok());

  kill(rank, SIGKILL);
  Wait(rank);
  ASSERT_TRUE((*busy)->Remove().ok());
  ASSERT_TRUE((*throwaway_.cgroups()->Open("j-000006-a1"))->Remove().ok());
  for (JobCgroups* cgroups : {gone.get(), gone_busy.get(), alive.get()}) {
    for (const std::string& name : cgroups->List()) (void)(*cgroups->Open(name))->Remove();
    (void)cgroups->RemoveDirectories();
  }
}

TEST_F(RealCgroupTest, TheProbeSaysThisMachineCanConfineJobs) {
  const CgroupSupport support = ProbeCgroupSupport(throwaway_.options());
  ASSERT_NE(support.cgroups, nullptr) << support.text;
  EXPECT_THAT(support.text, HasSubstr("memory"));
  EXPECT_THAT(support.text, HasSubstr(throwaway_.options().parent));
}

}  // namespace
}  // namespace fitrun::server
