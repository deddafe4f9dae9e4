#include "worker/data/text.h"

#include <ATen/ATen.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace fitrun::worker {
namespace {

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = testing::MakeTempDir("text_test") + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string Bytes(const at::Tensor& row) {
  const at::Tensor contiguous = row.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.numel());
}

TEST(TextTest, WindowCountsFollowTheNinetyTenSplit) {
  // 1000 bytes: train [0, 900), test [900, 1000); windows of context + 1 = 9 bytes every 8.
  EXPECT_EQ(TextWindowCount(1000, 8, Split::kTrain), (900 - 1) / 8);
  EXPECT_EQ(TextWindowCount(1000, 8, Split::kTest), (100 - 1) / 8);
  EXPECT_EQ(TextWindowCount(1000, 0, Split::kTrain), 0);
  EXPECT_EQ(TextWindowCount(5, 8, Split::kTest), 0);
}

TEST(TextTest, TargetsAreTheInputsShiftedByOneAndWindowsOverlapByOneByte) {
  std::string text;
  for (int i = 0; i < 100; ++i) text.push_back(static_cast<char>('a' + i % 26));
  const std::string path = WriteFile("alphabet.txt", text);

  absl::StatusOr<TensorDataset> train = LoadTextWindows(path, 4, Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_EQ(train->size(), (90 - 1) / 4);
  EXPECT_EQ(train->inputs[0].sizes(), (at::IntArrayRef{22, 4}));
  EXPECT_EQ(train->inputs[0].scalar_type(), at::kByte);
  EXPECT_EQ(Bytes(train->inputs[0][0]), "abcd");
  EXPECT_EQ(Bytes(train->targets[0]), "bcde");
  EXPECT_EQ(Bytes(train->inputs[0][1]), "efgh");
  EXPECT_EQ(Bytes(train->targets[21]), text.substr(85, 4));

  absl::StatusOr<TensorDataset> test = LoadTextWindows(path, 4, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  ASSERT_EQ(test->size(), (10 - 1) / 4);
  EXPECT_EQ(Bytes(test->inputs[0][0]), text.substr(90, 4));
  EXPECT_EQ(Bytes(test->targets[1]), text.substr(95, 4));
}

TEST(TextTest, AFileTooShortForTheContextSaysWhatWouldFit) {
  const std::string path = WriteFile("short.txt", std::string(50, 'x'));
  absl::StatusOr<TensorDataset> test = LoadTextWindows(path, 8, Split::kTest);
  EXPECT_EQ(test.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(test.status().message(), "test split")) << test.status();
  EXPECT_TRUE(absl::StrContains(test.status().message(), "100 bytes")) << test.status();
  EXPECT_FALSE(LoadTextWindows(path + ".missing", 8, Split::kTrain).ok());
}

}  // namespace
}  // namespace fitrun::worker
