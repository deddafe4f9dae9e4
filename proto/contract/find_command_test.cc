#include "proto/contract/find_command.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::contract::launch {
namespace {

using ::testing::HasSubstr;

// A fresh directory under the test's own temporary directory.
std::filesystem::path TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteFile(const std::filesystem::path& path, mode_t mode) {
  std::ofstream(path) << "#!/bin/sh\nexit 0\n";
  chmod(path.c_str(), mode);
}

TEST(FindCommandTest, ANameWithoutASlashIsLookedUpOnPath) {
  const std::filesystem::path dir = TempDir("on_path");
  WriteFile(dir / "train-tool", 0755);
  const std::string saved = std::getenv("PATH");
  setenv("PATH", ("/nonexistent:" + dir.string()).c_str(), 1);
  absl::StatusOr<std::string> found = FindCommand("train-tool", "/somewhere/else");
  setenv("PATH", saved.c_str(), 1);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, (dir / "train-tool").string());
}

TEST(FindCommandTest, ANameWithASlashIsTakenRelativeToTheWorkingDirectory) {
  const std::filesystem::path dir = TempDir("relative");
  std::filesystem::create_directories(dir / "bin");
  WriteFile(dir / "bin" / "run.sh", 0755);
  absl::StatusOr<std::string> found = FindCommand("bin/run.sh", dir.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, (dir / "bin" / "run.sh").string());
  EXPECT_EQ(*FindCommand((dir / "bin" / "run.sh").string(), "/elsewhere"), (dir / "bin" / "run.sh").string());
}

TEST(FindCommandTest, AFileThatIsNotExecutableOrADirectoryIsNotACommand) {
  const std::filesystem::path dir = TempDir("not_executable");
  WriteFile(dir / "notes.txt", 0644);
  absl::StatusOr<std::string> file = FindCommand("./notes.txt", dir.string());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("is not an executable file"));
  EXPECT_EQ(FindCommand(dir.string(), "").status().code(), absl::StatusCode::kNotFound);
}

TEST(FindCommandTest, AMissingNameSaysWhereItLookedAndWhatToDo) {
  absl::StatusOr<std::string> missing = FindCommand("no-such-program-anywhere", "/tmp");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("is not on PATH ("));
  EXPECT_THAT(missing.status().message(), HasSubstr("give its absolute path"));
  EXPECT_EQ(FindCommand("", "/tmp").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fitrun::contract::launch
