#include "proto/contract/testing/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace fitrun::contract {
namespace {

TEST(TempDirTest, MakesAFreshEmptyDirectoryUnderTheTestsOwn) {
  TempDir dir("temp-dir-test-");
  ASSERT_TRUE(dir.ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir.path()));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_EQ(std::filesystem::path(dir.path()).parent_path(), std::filesystem::path(std::getenv("TEST_TMPDIR")));
  EXPECT_EQ(std::filesystem::path(dir.path()).filename().string().rfind("temp-dir-test-", 0), 0u) << dir.path();
}

TEST(TempDirTest, TwoAreNeverTheSameDirectory) {
  TempDir first;
  TempDir second;
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(second.ok());
  EXPECT_NE(first.path(), second.path());
}

TEST(TempDirTest, MakesItUnderTheParentItIsGiven) {
  TempDir parent;
  ASSERT_TRUE(parent.ok());
  TempDir dir("child-", parent.path());
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(std::filesystem::path(dir.path()).parent_path(), std::filesystem::path(parent.path()));
}

TEST(TempDirTest, JoinNamesAFileInside) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(dir.Join("a.txt"), dir.path() + "/a.txt");
  EXPECT_EQ(dir.Join("sub/b.txt"), dir.path() + "/sub/b.txt");
}

TEST(TempDirTest, RemovesItselfAndWhatItHoldsWhenItGoes) {
  std::string path;
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    path = dir.path();
    std::filesystem::create_directories(dir.Join("nested/deeper"));
    std::ofstream(dir.Join("nested/deeper/file")) << "x";
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TempDirTest, IsNotOkWhereTheParentCannotHoldIt) {
  TempDir dir("x-", "/nonexistent-fitrun-parent");
  EXPECT_FALSE(dir.ok());
  EXPECT_EQ(dir.path(), "");
}

}  // namespace
}  // namespace fitrun::contract
