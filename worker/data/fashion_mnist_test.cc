#include "worker/data/fashion_mnist.h"

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace fitrun::worker {
namespace {

using ::fitrun::worker::testing::IdxBytes;
using ::fitrun::worker::testing::MakeTempDir;
using ::fitrun::worker::testing::WriteFakeFashionMnist;
using ::fitrun::worker::testing::WriteGz;

TEST(FashionMnistTest, LoadsBothSplitsNormalized) {
  const std::string dir = MakeTempDir("fmnist_ok");
  WriteFakeFashionMnist(dir, 20, 10);
  absl::StatusOr<TensorDataset> train = LoadFashionMnist(dir, Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size(), 20);
  EXPECT_EQ(train->inputs[0].sizes(), (at::IntArrayRef{20, 1, 28, 28}));
  EXPECT_EQ(train->inputs[0].scalar_type(), at::kFloat);
  EXPECT_EQ(train->targets.scalar_type(), at::kLong);
  EXPECT_EQ(train->targets[13].item<int64_t>(), 3);
  // A lit pixel (200) of sample 0 sits in row 0: (200/255 - mean) / std.
  EXPECT_NEAR(train->inputs[0][0][0][0][0].item<float>(), (200.0f / 255 - 0.2860f) / 0.3530f, 1e-5);

  absl::StatusOr<TensorDataset> test = LoadFashionMnist(dir, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10);
}

TEST(FashionMnistTest, MissingDirectoryNamesTheFile) {
  absl::StatusOr<TensorDataset> set = LoadFashionMnist("/nonexistent/fmnist", Split::kTrain);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(set.status().message(), "/nonexistent/fmnist/train-images-idx3-ubyte.gz"));
}

TEST(FashionMnistTest, RejectsCountMismatch) {
  const std::string dir = MakeTempDir("fmnist_mismatch");
  WriteFakeFashionMnist(dir, 20, 10);
  WriteGz(dir + "/train-labels-idx1-ubyte.gz", IdxBytes({19}, std::vector<uint8_t>(19, 1)));
  absl::StatusOr<TensorDataset> set = LoadFashionMnist(dir, Split::kTrain);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(set.status().message(), "19 labels"));
}

TEST(FashionMnistTest, RejectsOutOfRangeLabel) {
  const std::string dir = MakeTempDir("fmnist_label");
  WriteFakeFashionMnist(dir, 20, 10);
  WriteGz(dir + "/t10k-labels-idx1-ubyte.gz", IdxBytes({10}, std::vector<uint8_t>(10, 10)));
  EXPECT_EQ(LoadFashionMnist(dir, Split::kTest).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FashionMnistTest, RejectsWrongImageSize) {
  const std::string dir = MakeTempDir("fmnist_size");
  WriteFakeFashionMnist(dir, 20, 10);
  WriteGz(dir + "/t10k-images-idx3-ubyte.gz", IdxBytes({10, 14, 14}, std::vector<uint8_t>(1960, 0)));
  absl::StatusOr<TensorDataset> set = LoadFashionMnist(dir, Split::kTest);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(set.status().message(), "14x14"));
}

}  // namespace
}  // namespace fitrun::worker
