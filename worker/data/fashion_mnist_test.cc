#include "worker/data/fashion_mnist.h"

#include <ATen/ATen.h>

#include <cstring>
#include <vector>

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

// Fashion-MNIST files in `dir` whose images hold every byte value: image i, pixel p is (i * 784 + p * 3) % 256.
std::vector<uint8_t> WriteEveryPixelValue(const std::string& dir, int n) {
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * 784);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i / 784 * 784 + i % 784 * 3) % 256);
  std::vector<uint8_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  for (const std::string prefix : {"train", "t10k"}) {
    WriteGz(dir + "/" + prefix + "-images-idx3-ubyte.gz", IdxBytes({n, 28, 28}, pixels));
    WriteGz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", IdxBytes({n}, labels));
  }
  return pixels;
}

bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(FashionMnistTest, CachedLoadsAreBitIdenticalToDecodingWithTheTensorOps) {
  const std::string dir = MakeTempDir("fmnist_cached");
  std::vector<uint8_t> pixels = WriteEveryPixelValue(dir, 30);
  // What the loader computed before the cache: LibTorch's ops on the whole tensor.
  const at::Tensor reference = at::from_blob(pixels.data(), {30, 1, 28, 28}, at::kByte)
                                   .to(at::kFloat)
                                   .div_(255.0f)
                                   .sub_(kFashionMnistMean)
                                   .div_(kFashionMnistStd);

  absl::StatusOr<TensorDataset> uncached = LoadFashionMnist(dir, Split::kTrain);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  DatasetCache cold({dir + "/cache"});
  absl::StatusOr<TensorDataset> written = LoadFashionMnist(dir, Split::kTrain, &cold);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(cold.stats().written, 2);
  DatasetCache warm({dir + "/cache"});
  absl::StatusOr<TensorDataset> mapped = LoadFashionMnist(dir, Split::kTrain, &warm);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(warm.stats().mapped, 2);
  EXPECT_EQ(warm.stats().decoded, 0);

  for (const TensorDataset* set : {&*uncached, &*written, &*mapped}) {
    EXPECT_TRUE(SameBits(set->inputs[0], reference));
    EXPECT_TRUE(at::equal(set->targets, at::arange(30, at::kLong).remainder(10)));
    EXPECT_EQ(set->targets.scalar_type(), at::kLong);
  }
}

TEST(FashionMnistTest, ACachedLabelStillHasItsRangeChecked) {
  const std::string dir = MakeTempDir("fmnist_cached_label");
  WriteFakeFashionMnist(dir, 20, 10);
  WriteGz(dir + "/t10k-labels-idx1-ubyte.gz", IdxBytes({10}, std::vector<uint8_t>(10, 10)));
  DatasetCache cold({dir + "/cache"});
  EXPECT_EQ(LoadFashionMnist(dir, Split::kTest, &cold).status().code(), absl::StatusCode::kInvalidArgument);
  DatasetCache warm({dir + "/cache"});
  EXPECT_EQ(LoadFashionMnist(dir, Split::kTest, &warm).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(warm.stats().mapped, 2);
}

}  // namespace
}  // namespace fitrun::worker
