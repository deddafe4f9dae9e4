#include "worker/data/idx.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace fitrun::worker {
namespace {

using ::fitrun::worker::testing::IdxBytes;
using ::fitrun::worker::testing::MakeTempDir;
using ::fitrun::worker::testing::WriteGz;

class IdxTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    WriteGz(path, bytes);
    return path;
  }
  std::string dir_ = MakeTempDir("idx_test");
};

TEST_F(IdxTest, ReadsDimensionsAndPayload) {
  const std::string path = Write("ok.gz", IdxBytes({2, 3}, {1, 2, 3, 4, 5, 6}));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path, 2);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(array->data, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST_F(IdxTest, MissingFileIsNotFound) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(dir_ + "/nope.gz", 1);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(array.status().message(), "nope.gz"));
}

TEST_F(IdxTest, RejectsWrongMagic) {
  std::string bytes = IdxBytes({2}, {1, 2});
  bytes[2] = 0x0d;  // float payload
  EXPECT_EQ(ReadIdxFile(Write("float.gz", bytes), 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IdxTest, RejectsWrongDimensionCount) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(Write("dims.gz", IdxBytes({2}, {1, 2})), 3);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(array.status().message(), "expected 3 dimensions"));
}

TEST_F(IdxTest, RejectsTruncatedPayload) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(Write("short.gz", IdxBytes({4}, {1, 2})), 1);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(array.status().message(), "truncated"));
}

TEST_F(IdxTest, RejectsTrailingBytes) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(Write("long.gz", IdxBytes({1}, {1, 2})), 1);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(IdxTest, RejectsTruncatedHeader) {
  EXPECT_EQ(ReadIdxFile(Write("header.gz", std::string("\0\0", 2)), 1).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace fitrun::worker
