#include "worker/data/idx.h"

#include <sys/resource.h>

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

// Found by tools/fuzz.sh (readers_fuzz ran out of memory): a few bytes whose header claimed 4 GB
// made the reader allocate and zero the 4 GB before finding the file short.
TEST_F(IdxTest, TinyFileClaimingGigabytesFailsWithoutAllocatingThem) {
  const auto peak_rss_kb = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss;
  };
  std::string bytes = IdxBytes({1, 1, 1}, {7});
  const uint8_t header[] = {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 255};  // 65536 x 256 x 255 = 4.28e9 bytes
  bytes.replace(4, sizeof(header), reinterpret_cast<const char*>(header), sizeof(header));
  const long before = peak_rss_kb();
  absl::StatusOr<IdxArray> array = ReadIdxFile(Write("liar.gz", bytes), 3);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(array.status().message(), "header promises 4278190080 bytes"));
  EXPECT_LT(peak_rss_kb() - before, 64 * 1024) << "kB of peak RSS grew while reading a 17-byte file";
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
