#include "server/testing/read_file.h"

#include <gtest/gtest.h>

#include <fstream>

#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

TEST(ReadFileForTestTest, ReadsTheWholeFileAndAMissingOneAsEmpty) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Join("log");
  EXPECT_EQ(ReadFileForTest(path), "");
  std::ofstream(path) << "first\nsecond\n";
  EXPECT_EQ(ReadFileForTest(path), "first\nsecond\n");
}

}  // namespace
}  // namespace fitrun::server
