#include "proto/contract/atomic_file.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace fitrun::contract {
namespace {

// A fresh directory under the test's temporary directory.
std::string MakeTempDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(AtomicFileTest, WritesThePiecesInOrderAndReplacesTheOldFile) {
  const std::string dir = MakeTempDir("atomic_file_replace");
  const std::string path = dir + "/file";
  const absl::string_view first[] = {"old"};
  ASSERT_TRUE(WriteFileAtomically(path, first).ok());
  const absl::string_view pieces[] = {"head", absl::string_view("\0tail", 5)};
  ASSERT_TRUE(WriteFileAtomically(path, pieces, 0640).ok());
  EXPECT_EQ(ReadFile(path), std::string("head\0tail", 9));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  // Nothing left beside it.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1);
}

TEST(AtomicFileTest, AFailedWriteLeavesNothing) {
  const std::string dir = MakeTempDir("atomic_file_fail");
  const absl::string_view pieces[] = {"bytes"};
  // The target is a directory: the rename fails after the temporary was written.
  std::filesystem::create_directories(dir + "/taken/inside");
  absl::Status status = WriteFileAtomically(dir + "/taken", pieces);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(dir + "/taken"), std::string::npos) << status;
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) entries += entry.path().filename() != "taken";
  EXPECT_EQ(entries, 0);
  // A directory that does not exist: no temporary can be made.
  EXPECT_FALSE(WriteFileAtomically(dir + "/missing/file", pieces).ok());
}

}  // namespace
}  // namespace fitrun::contract
