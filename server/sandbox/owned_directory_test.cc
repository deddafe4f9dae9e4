// What an account can plant in a directory fitrund works in (symlinks to files it must not touch,
// FIFOs, directories where files were) never makes fitrund write, give away or read anything the
// account could not, and never blocks it; with the kernel's openat2 and with the O_NOFOLLOW
// descriptor walk used where the kernel lacks it. The cases with an account need root (a throwaway
// account); the others run as anyone.
#include "server/sandbox/owned_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "server/sandbox/throwaway_account.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Owner {
  uid_t uid;
  mode_t mode;
};
Owner OwnerOf(const fs::path& path) {
  struct stat info {};
  EXPECT_EQ(lstat(path.c_str(), &info), 0) << path;
  return {info.st_uid, info.st_mode & 07777};
}

// The parameter: whether paths are resolved by the descriptor walk instead of openat2.
class OwnedDirectoryTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    OwnedDirectory::UseDescriptorWalkForTesting(GetParam());
    // Under /tmp, reachable by a throwaway account, so only modes decide what it may do.
    ASSERT_TRUE(dir_.ok());
    root_ = dir_.path();
    chmod(root_.c_str(), 0755);
    // A victim outside: a file and a directory only fitrund's user may change.
    victim_dir_ = root_ / "victim";
    fs::create_directory(victim_dir_);
    chmod(victim_dir_.c_str(), 0755);
    victim_ = victim_dir_ / "secret";
    std::ofstream(victim_) << "fitrund's alone\n";
    chmod(victim_.c_str(), 0600);
    jobs_ = root_ / "jobs";
    fs::create_directory(jobs_);
    chmod(jobs_.c_str(), 0711);
  }
  void TearDown() override {
    OwnedDirectory::UseDescriptorWalkForTesting(false);
  }
  void ExpectVictimsUntouched() {
    EXPECT_EQ(Read(victim_), "fitrund's alone\n");
    EXPECT_EQ(OwnerOf(victim_).uid, geteuid());
    EXPECT_EQ(OwnerOf(victim_).mode, 0600u);
    EXPECT_EQ(OwnerOf(victim_dir_).uid, geteuid());
    EXPECT_EQ(OwnerOf(victim_dir_).mode, 0755u);
    EXPECT_EQ(fs::directory_iterator(victim_dir_)->path(), victim_) << "nothing new in the victim directory";
  }

  TempDir dir_{"fitrun-owned-", "/tmp"};
  fs::path root_, victim_dir_, victim_, jobs_;
};

TEST_P(OwnedDirectoryTest, WritesReadsAndMakesDirectoriesInside) {
  absl::StatusOr<OwnedDirectory> job = OwnedDirectory::Open((jobs_ / "j-1").string(), std::nullopt, true);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(OwnerOf(jobs_ / "j-1").mode, 0700u);
  ASSERT_TRUE(job->MakeDirectory("attempt-1").ok());
  ASSERT_TRUE(job->MakeDirectory("attempt-1").ok()) << "an existing directory is kept";
  ASSERT_TRUE(job->WriteFile("attempt-1/assignment.textproto", "one", 0600).ok());
  ASSERT_TRUE(job->WriteFile("attempt-1/assignment.textproto", "two", 0640).ok()) << "replaced whole";
  EXPECT_EQ(Read(jobs_ / "j-1/attempt-1/assignment.textproto"), "two");
  EXPECT_EQ(OwnerOf(jobs_ / "j-1/attempt-1/assignment.textproto").mode, 0640u);
  absl::StatusOr<UntrustedFile> file = job->OpenForReading("attempt-1/assignment.textproto");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file->ReadAt(1, 100), "wo");
  EXPECT_EQ(file->ReadTail(2)->bytes, "wo");
  EXPECT_EQ(file->ReadTail(2)->offset, 1);
  EXPECT_TRUE(absl::IsNotFound(job->OpenForReading("attempt-1/none").status()));
  ASSERT_TRUE(job->RemoveFile("attempt-1/assignment.textproto").ok());
  ASSERT_TRUE(job->RemoveFile("attempt-1/assignment.textproto").ok()) << "removing what is gone is no error";
  EXPECT_FALSE(fs::exists(jobs_ / "j-1/attempt-1/assignment.textproto"));
  // Only plain relative paths.
  for (const char* bad : {"../victim/secret", "/etc/passwd", "attempt-1/../x", "", "a//b"}) {
    EXPECT_EQ(job->WriteFile(bad, "x", 0600).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  ExpectVictimsUntouched();
}

TEST_P(OwnedDirectoryTest, PlantedSymlinksAreNeverFollowed) {
  absl::StatusOr<OwnedDirectory> job = OwnedDirectory::Open((jobs_ / "j-1").string(), std::nullopt, true);
  ASSERT_TRUE(job.ok()) << job.status();
  // A directory that is a symlink to the victim's: nothing is made, written or read through it.
  fs::create_directory_symlink(victim_dir_, jobs_ / "j-1/attempt-2");
  EXPECT_EQ(job->MakeDirectory("attempt-2").code(), absl::StatusCode::kFailedPrecondition);
  absl::Status written = job->WriteFile("attempt-2/secret", "planted", 0644);
  EXPECT_EQ(written.code(), absl::StatusCode::kFailedPrecondition) << written;
  EXPECT_NE(written.message().find("symlink"), std::string::npos) << written;
  EXPECT_EQ(job->OpenForReading("attempt-2/secret").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(job->RemoveFile("attempt-2/secret").code() == absl::StatusCode::kFailedPrecondition);
  // A file that is a symlink to the victim: writing replaces the link, reading refuses it.
  ASSERT_TRUE(job->MakeDirectory("attempt-3").ok());
  fs::create_symlink(victim_, jobs_ / "j-1/attempt-3/assignment.textproto");
  EXPECT_EQ(job->OpenForReading("attempt-3/assignment.textproto").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(job->WriteFile("attempt-3/assignment.textproto", "mine", 0600).ok());
  EXPECT_FALSE(fs::is_symlink(jobs_ / "j-1/attempt-3/assignment.textproto"));
  EXPECT_EQ(Read(jobs_ / "j-1/attempt-3/assignment.textproto"), "mine");
  // The job directory itself a symlink: not opened.
  fs::create_directory_symlink(victim_dir_, jobs_ / "j-2");
  EXPECT_EQ(OwnedDirectory::Open((jobs_ / "j-2").string(), std::nullopt, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectVictimsUntouched();
}

TEST_P(OwnedDirectoryTest, FifosAndDirectoriesAreRefusedAtOnceNotRead) {
  absl::StatusOr<OwnedDirectory> job = OwnedDirectory::Open((jobs_ / "j-1").string(), std::nullopt, true);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(mkfifo((jobs_ / "j-1/rank-0.log").c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<UntrustedFile> fifo = job->OpenForReading("rank-0.log");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ASSERT_EQ(fifo.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fifo.status().message().find("a FIFO"), std::string::npos) << fifo.status();
  fs::create_directory(jobs_ / "j-1/rank-1.log");
  EXPECT_NE(job->OpenForReading("rank-1.log").status().message().find("a directory"), std::string::npos);
}

TEST_P(OwnedDirectoryTest, ReadsStayWithinTheirBoundWhateverTheFileGrowsTo) {
  absl::StatusOr<OwnedDirectory> job = OwnedDirectory::Open((jobs_ / "j-1").string(), std::nullopt, true);
  ASSERT_TRUE(job.ok()) << job.status();
  // A sparse file of a terabyte: its tail is read, not its whole.
  {
    std::ofstream(jobs_ / "j-1/rank-0.log") << "start\n";
  }
  fs::resize_file(jobs_ / "j-1/rank-0.log", int64_t{1} << 40);
  absl::StatusOr<UntrustedFile> log = job->OpenForReading("rank-0.log");
  ASSERT_TRUE(log.ok()) << log.status();
  absl::StatusOr<UntrustedFile::Tail> tail = log->ReadTail(4096);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->bytes.size(), 4096u);
  EXPECT_EQ(tail->offset, (int64_t{1} << 40) - 4096);
  EXPECT_EQ(log->ReadAt(0, 3)->size(), 3u);
}

// With an owner: fitrund's rights are the account's, and the directory is the account's.
class OwnedByAccountTest : public OwnedDirectoryTest {
 protected:
  void SetUp() override {
    OwnedDirectoryTest::SetUp();
    if (!account_.available()) GTEST_SKIP() << account_.why();
    absl::StatusOr<UnixAccount> account = LookUpUnixAccount(account_.name());
    ASSERT_TRUE(account.ok()) << account.status();
    owner_ = *account;
  }
  ThrowawayAccount account_{"fitrun-od-"};
  std::optional<UnixAccount> owner_;
};

TEST_P(OwnedByAccountTest, TheDirectoryAndWhatIsMadeInItAreTheAccounts) {
  absl::StatusOr<OwnedDirectory> job = OwnedDirectory::Open((jobs_ / "j-1").string(), owner_, true);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(OwnerOf(jobs_ / "j-1").uid, owner_->uid);
  EXPECT_EQ(OwnerOf(jobs_ / "j-1").mode, 0700u);
  ASSERT_TRUE(job->MakeDirectory("attempt-1").ok());
  ASSERT_TRUE(job->WriteFile("attempt-1/assignment.textproto", "text", 0600).ok());
  EXPECT_EQ(OwnerOf(jobs_ / "j-1/attempt-1").uid, owner_->uid);
  EXPECT_EQ(OwnerOf(jobs_ / "j-1/attempt-1/assignment.textproto").uid, owner_->uid);
  // Root's rights are back on this thread afterwards.
  EXPECT_EQ(access(victim_.c_str(), R_OK | W_OK), 0);
}

TEST_P(OwnedByAccountTest, WhatTheAccountCannotReadFitrundCannotReadForIt) {
  absl::StatusOr<OwnedDirectory> job = OwnedDirectory::Open((jobs_ / "j-1").string(), owner_, true);
  ASSERT_TRUE(job.ok()) << job.status();
  // A hard link to the victim, as a file system without protected_hardlinks would let it make.
  ASSERT_EQ(link(victim_.c_str(), (jobs_ / "j-1/rank-0.log").c_str()), 0);
  absl::StatusOr<UntrustedFile> log = job->OpenForReading("rank-0.log");
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("Permission denied"), std::string::npos) << log.status();
  // Writing over it replaces the link; the victim keeps its contents.
  ASSERT_TRUE(job->WriteFile("rank-0.log", "mine", 0600).ok());
  ExpectVictimsUntouched();
}

TEST_P(OwnedByAccountTest, AParentOthersMayWriteIsRefused) {
  chmod(jobs_.c_str(), 0777);
  absl::StatusOr<OwnedDirectory> job = OwnedDirectory::Open((jobs_ / "j-1").string(), owner_, true);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(job.status().message().find(jobs_.string()), std::string::npos) << job.status();
}

TEST_P(OwnedByAccountTest, AccountSubdirectoryIsTheAccountsAlone) {
  absl::StatusOr<std::string> cache = AccountSubdirectory((root_ / "datasets").string(), *owner_);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(*cache, (root_ / "datasets" / owner_->name).string());
  EXPECT_EQ(OwnerOf(*cache).uid, owner_->uid);
  EXPECT_EQ(OwnerOf(*cache).mode, 0700u);
}

INSTANTIATE_TEST_SUITE_P(Resolution, OwnedDirectoryTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DescriptorWalk" : "Openat2"; });
INSTANTIATE_TEST_SUITE_P(Resolution, OwnedByAccountTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DescriptorWalk" : "Openat2"; });

}  // namespace
}  // namespace fitrun::server
