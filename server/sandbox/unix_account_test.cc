// Accounts from the real password database, and a thread reading files with an account's rights
// while fitrund's other threads keep root's (a throwaway account; skipped when not root).
#include "server/sandbox/unix_account.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/sandbox/throwaway_account.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

TEST(LookUpUnixAccountTest, UnknownAccountIsNotFoundAndNamed) {
  absl::StatusOr<UnixAccount> account = LookUpUnixAccount("no-such-fitrun-account");
  ASSERT_EQ(account.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(account.status().message().find("no-such-fitrun-account"), std::string::npos);
}

TEST(LookUpUnixAccountTest, RootIsRefused) {
  absl::StatusOr<UnixAccount> account = LookUpUnixAccount("root");
  ASSERT_EQ(account.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(account.status().message().find("never run as root"), std::string::npos);
}

TEST(LookUpUnixAccountTest, AccountHasItsIdsAndGroups) {
  // "nobody" is in every Debian password database.
  absl::StatusOr<UnixAccount> nobody = LookUpUnixAccount("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  EXPECT_EQ(nobody->uid, 65534u);
  EXPECT_NE(std::find(nobody->groups.begin(), nobody->groups.end(), nobody->gid), nobody->groups.end());
}

class FileAccessAsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!account_.available()) GTEST_SKIP() << account_.why();
    // Under /tmp, not the test's own directory: the account must be able to reach the files, so
    // that only their modes decide.
    ASSERT_TRUE(dir_.ok());
    chmod(dir_.path().c_str(), 0755);
    // Root's file, readable by root alone.
    secret_ = dir_.Join("secret");
    std::ofstream(secret_) << "root only\n";
    chmod(secret_.c_str(), 0600);
  }
  bool CanRead(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) close(fd);
    return fd >= 0;
  }
  ThrowawayAccount account_{"fitrun-fa-"};
  TempDir dir_{"fitrun-file-access-", "/tmp"};
  std::string secret_;
};

TEST_F(FileAccessAsTest, ThreadReadsWithTheAccountsRightsThenRootsAgain) {
  absl::StatusOr<UnixAccount> account = LookUpUnixAccount(account_.name());
  ASSERT_TRUE(account.ok()) << account.status();
  ASSERT_TRUE(CanRead(secret_));
  // A thread that exists before the switch (as fitrund's others do; a thread started later would
  // inherit its creator's ids) reads when told to.
  absl::Notification switched, read_done;
  bool other_thread_reads = false;
  std::thread other([&] {
    switched.WaitForNotification();
    other_thread_reads = CanRead(secret_);
    read_done.Notify();
  });
  {
    FileAccessAs as(*account);
    ASSERT_TRUE(as.status().ok()) << as.status();
    EXPECT_FALSE(CanRead(secret_)) << "the account read a 0600 file of root's";
    EXPECT_TRUE(CanRead("/etc/hostname"));  // world-readable files stay readable
    switched.Notify();
    read_done.WaitForNotification();
  }
  other.join();
  EXPECT_TRUE(other_thread_reads) << "the switch reached another thread";
  EXPECT_TRUE(CanRead(secret_)) << "root's rights did not come back";
}

TEST_F(FileAccessAsTest, GroupMembershipCounts) {
  absl::StatusOr<UnixAccount> account = LookUpUnixAccount(account_.name());
  ASSERT_TRUE(account.ok()) << account.status();
  // Root's file, readable by the account's group.
  const std::string shared = dir_.Join("group-readable");
  std::ofstream(shared) << "group\n";
  ASSERT_EQ(chown(shared.c_str(), 0, account->gid), 0);
  chmod(shared.c_str(), 0640);
  FileAccessAs as(*account);
  ASSERT_TRUE(as.status().ok()) << as.status();
  EXPECT_TRUE(CanRead(shared));
}

TEST_F(FileAccessAsTest, AMagicLinkIntoAnotherProcesssPrivateDirectoryIsNotFollowed) {
  absl::StatusOr<UnixAccount> account = LookUpUnixAccount(account_.name());
  ASSERT_TRUE(account.ok()) << account.status();
  // A world-readable file in a world-searchable directory, under a directory only root may search,
  // and a process of root's whose working directory is that inner directory.
  const std::filesystem::path inner = dir_.Join("private/inner");
  std::filesystem::create_directories(inner);
  chmod(dir_.Join("private").c_str(), 0700);
  chmod(inner.c_str(), 0755);
  std::ofstream(inner / "file") << "behind a private directory\n";
  chmod((inner / "file").c_str(), 0644);
  const pid_t holder = fork();
  if (holder == 0) {
    if (chdir(inner.c_str()) != 0) _exit(1);
    pause();
    _exit(0);
  }
  ASSERT_GT(holder, 0);
  const std::string through_proc = absl::StrCat("/proc/", holder, "/cwd/file");
  for (int i = 0; i < 200 && !CanRead(through_proc); ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(CanRead(through_proc)) << "root follows it";
  {
    FileAccessAs as(*account);
    ASSERT_TRUE(as.status().ok()) << as.status();
    EXPECT_FALSE(CanRead((inner / "file").string())) << "the account searched root's private directory";
    EXPECT_FALSE(CanRead(through_proc)) << "the account went through /proc/<pid>/cwd with root's CAP_SYS_PTRACE";
  }
  EXPECT_TRUE(CanRead(through_proc)) << "root's capabilities did not come back";
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
}

}  // namespace
}  // namespace fitrun::server
