#include "worker/data/dataset_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace fitrun::worker {
namespace {

using ::fitrun::worker::testing::IdxBytes;
using ::fitrun::worker::testing::MakeTempDir;
using ::fitrun::worker::testing::WriteGz;

constexpr size_t kHeaderBytes = 128;

std::vector<uint8_t> Bytes(const IdxData& data) { return {data.bytes().begin(), data.bytes().end()}; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

// Files in `dir` whose names contain `part`.
int CountFiles(const std::string& dir, const std::string& part) {
  int n = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    n += absl::StrContains(file.path().filename().string(), part) ? 1 : 0;
  }
  return n;
}

class DatasetCacheTest : public ::testing::Test {
 protected:
  // A cache on this test's directory whose log lines the test reads.
  DatasetCache Cache() {
    return DatasetCache({cache_dir_, [this](const std::string& line) { log_.push_back(line); }});
  }

  // One directory per test (parameterized tests' names hold a '/').
  const std::string dir_ = MakeTempDir(
      absl::StrReplaceAll(::testing::UnitTest::GetInstance()->current_test_info()->name(), {{"/", "_"}}));
  // Not created yet: the first writer creates it.
  const std::string cache_dir_ = dir_ + "/cache/datasets";
  const std::string source_ = dir_ + "/images-idx2-ubyte.gz";
  const std::vector<uint8_t> pixels_ = {1, 2, 3, 4, 5, 250};
  std::vector<std::string> log_;

  void SetUp() override { WriteGz(source_, IdxBytes({2, 3}, pixels_)); }
};

TEST_F(DatasetCacheTest, AMissDecodesAndWritesTheEntry) {
  DatasetCache cache = Cache();
  absl::StatusOr<IdxData> data = cache.ReadIdx(source_, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->mapped());
  EXPECT_EQ(data->dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Bytes(*data), pixels_);
  EXPECT_EQ(cache.stats().decoded, 1);
  EXPECT_EQ(cache.stats().written, 1);

  absl::StatusOr<std::string> entry = cache.EntryPath(source_);
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_EQ(std::filesystem::path(*entry).parent_path(), cache_dir_);
  EXPECT_TRUE(absl::StartsWith(std::filesystem::path(*entry).filename().string(), "images-idx2-ubyte.gz."));
  const std::string written = ReadFile(*entry);
  ASSERT_EQ(written.size(), kHeaderBytes + pixels_.size());
  EXPECT_EQ(written.substr(0, 8), "fitrunDC");
  EXPECT_EQ(written.substr(kHeaderBytes), std::string(pixels_.begin(), pixels_.end()));
  EXPECT_EQ(CountFiles(cache_dir_, ".tmp-"), 0);
  EXPECT_TRUE(log_.empty());
}

TEST_F(DatasetCacheTest, AHitMapsTheEntryInsteadOfDecoding) {
  ASSERT_TRUE(Cache().ReadIdx(source_, 2).ok());
  // Another rank's cache: the entry's payload is what it returns, so marking the entry's last byte
  // shows the bytes came from the entry and not from the source.
  const std::string entry = *Cache().EntryPath(source_);
  std::string bytes = ReadFile(entry);
  bytes.back() = 7;
  WriteFile(entry, bytes);

  DatasetCache cache = Cache();
  absl::StatusOr<IdxData> data = cache.ReadIdx(source_, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->mapped());
  EXPECT_EQ(data->dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Bytes(*data), (std::vector<uint8_t>{1, 2, 3, 4, 5, 7}));
  EXPECT_EQ(cache.stats().mapped, 1);
  EXPECT_EQ(cache.stats().decoded, 0);
  EXPECT_EQ(cache.stats().written, 0);

  // The mapping outlives the cache object and its copies share it.
  IdxData copy = *data;
  data = absl::NotFoundError("dropped");
  EXPECT_EQ(Bytes(copy), (std::vector<uint8_t>{1, 2, 3, 4, 5, 7}));
}

// One way of damaging an entry, applied to its bytes.
struct Damage {
  std::string name;
  void (*apply)(std::string& entry);
};

class DamagedEntryTest : public DatasetCacheTest, public ::testing::WithParamInterface<Damage> {};

TEST_P(DamagedEntryTest, IsIgnoredAndRewritten) {
  ASSERT_TRUE(Cache().ReadIdx(source_, 2).ok());
  const std::string entry = *Cache().EntryPath(source_);
  std::string bytes = ReadFile(entry);
  GetParam().apply(bytes);
  WriteFile(entry, bytes);

  DatasetCache cache = Cache();
  absl::StatusOr<IdxData> data = cache.ReadIdx(source_, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->mapped());
  EXPECT_EQ(Bytes(*data), pixels_);
  EXPECT_EQ(cache.stats().rejected, 1);
  EXPECT_EQ(cache.stats().written, 1);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_TRUE(absl::StrContains(log_[0], "ignoring " + entry)) << log_[0];

  // Rewritten whole: the next reader maps it.
  DatasetCache next = Cache();
  absl::StatusOr<IdxData> again = next.ReadIdx(source_, 2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->mapped());
  EXPECT_EQ(Bytes(*again), pixels_);
}

INSTANTIATE_TEST_SUITE_P(
    Damages, DamagedEntryTest,
    ::testing::Values(
        Damage{"Empty", [](std::string& e) { e.clear(); }},
        Damage{"ShorterThanItsHeader", [](std::string& e) { e.resize(100); }},
        Damage{"PayloadCutShort", [](std::string& e) { e.pop_back(); }},
        Damage{"TrailingBytes", [](std::string& e) { e += "xx"; }},
        Damage{"WrongMagic", [](std::string& e) { e[0] = 'F'; }},
        Damage{"OtherVersion", [](std::string& e) { e[8] = 99; }},
        Damage{"OtherSourceKey", [](std::string& e) { e[16] ^= 1; }},
        Damage{"PayloadSizeDisagreesWithDims", [](std::string& e) { e[24] = 5; }},
        // dims[0] = 3 and a payload of 9 bytes to match: more than the file holds.
        Damage{"DimensionsPromiseMore",
               [](std::string& e) {
                 e[32] = 3;
                 e[24] = 9;
               }},
        Damage{"NegativeDimension", [](std::string& e) { e[39] = static_cast<char>(0x80); }},
        // 2^32 x 2^32: a product past int64 if it were multiplied before it is checked.
        Damage{"DimensionsOverflow",
               [](std::string& e) {
                 e[32] = 0;
                 e[36] = 1;
                 e[40] = 0;
                 e[44] = 1;
               }}),
    [](const ::testing::TestParamInfo<Damage>& info) { return info.param.name; });

TEST_F(DatasetCacheTest, AnEntryReadWithOtherDimensionsIsNotTrusted) {
  ASSERT_TRUE(Cache().ReadIdx(source_, 2).ok());
  DatasetCache cache = Cache();
  // The source says 2 dimensions: ReadIdxFile's error, not the entry's bytes.
  EXPECT_EQ(cache.ReadIdx(source_, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.stats().mapped, 0);
  EXPECT_EQ(cache.stats().rejected, 1);
}

TEST_F(DatasetCacheTest, AChangedSourceGetsANewEntry) {
  DatasetCache first = Cache();
  ASSERT_TRUE(first.ReadIdx(source_, 2).ok());
  const std::string old_entry = *first.EntryPath(source_);

  // Same size, other bytes, a later mtime.
  WriteGz(source_, IdxBytes({2, 3}, {9, 9, 9, 9, 9, 9}));
  struct timespec times[2] = {{0, UTIME_OMIT}, {0, 0}};
  clock_gettime(CLOCK_REALTIME, &times[1]);
  times[1].tv_sec += 5;
  ASSERT_EQ(utimensat(AT_FDCWD, source_.c_str(), times, 0), 0);

  DatasetCache cache = Cache();
  const std::string new_entry = *cache.EntryPath(source_);
  EXPECT_NE(new_entry, old_entry);
  absl::StatusOr<IdxData> data = cache.ReadIdx(source_, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->mapped());
  EXPECT_EQ(Bytes(*data), (std::vector<uint8_t>{9, 9, 9, 9, 9, 9}));
  EXPECT_TRUE(std::filesystem::exists(new_entry));

  // The same bytes at another path are another source too.
  const std::string copy = dir_ + "/copy-idx2-ubyte.gz";
  std::filesystem::copy_file(source_, copy);
  EXPECT_NE(*cache.EntryPath(copy), new_entry);
}

TEST_F(DatasetCacheTest, AnEntryRenamedToAnotherSourcesNameIsNotTrusted) {
  const std::string other = dir_ + "/other-idx2-ubyte.gz";
  WriteGz(other, IdxBytes({2, 3}, {6, 5, 4, 3, 2, 1}));
  ASSERT_TRUE(Cache().ReadIdx(source_, 2).ok());
  std::filesystem::copy_file(*Cache().EntryPath(source_), *Cache().EntryPath(other));

  DatasetCache cache = Cache();
  absl::StatusOr<IdxData> data = cache.ReadIdx(other, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(Bytes(*data), (std::vector<uint8_t>{6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(cache.stats().rejected, 1);
  EXPECT_TRUE(absl::StrContains(log_.at(0), "another source")) << log_[0];
}

TEST_F(DatasetCacheTest, AnUnwritableDirectoryFallsBackToDecodingWithOneLogLine) {
  // Under a regular file, so not even root can create it.
  WriteFile(dir_ + "/cache", "a file, not a directory");
  DatasetCache cache = Cache();
  const std::string labels = dir_ + "/labels-idx1-ubyte.gz";
  WriteGz(labels, IdxBytes({2}, {0, 1}));
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<IdxData> data = cache.ReadIdx(source_, 2);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(Bytes(*data), pixels_);
    ASSERT_TRUE(cache.ReadIdx(labels, 1).ok());
  }
  EXPECT_EQ(cache.stats().decoded, 4);
  EXPECT_EQ(cache.stats().written, 0);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_TRUE(absl::StrContains(log_[0], cache_dir_)) << log_[0];
  EXPECT_TRUE(absl::StrContains(log_[0], "decoded as without it")) << log_[0];
}

TEST_F(DatasetCacheTest, AfterAFailedWriteTheEntriesThereAreStillMapped) {
  ASSERT_TRUE(Cache().ReadIdx(source_, 2).ok());
  // Another source whose entry's name is taken by a directory: its write fails at the rename.
  const std::string other = dir_ + "/other-idx1-ubyte.gz";
  WriteGz(other, IdxBytes({2}, {7, 8}));
  std::filesystem::create_directories(*Cache().EntryPath(other) + "/in-the-way");

  DatasetCache cache = Cache();
  absl::StatusOr<IdxData> decoded = cache.ReadIdx(other, 1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(Bytes(*decoded), (std::vector<uint8_t>{7, 8}));
  EXPECT_EQ(cache.stats().written, 0);
  ASSERT_FALSE(log_.empty());
  EXPECT_TRUE(absl::StrContains(log_.back(), "not written")) << log_.back();
  absl::StatusOr<IdxData> mapped = cache.ReadIdx(source_, 2);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE(mapped->mapped());
  EXPECT_EQ(Bytes(*mapped), pixels_);
}

TEST_F(DatasetCacheTest, RanksMissingAtOnceEachWriteAndAWholeEntryWins) {
  constexpr int kRanks = 4;
  std::vector<std::vector<uint8_t>> got(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      DatasetCache cache({cache_dir_, [](const std::string&) {}});
      absl::StatusOr<IdxData> data = cache.ReadIdx(source_, 2);
      if (data.ok()) got[r] = Bytes(*data);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(got[r], pixels_) << "rank " << r;
  EXPECT_EQ(CountFiles(cache_dir_, ".tmp-"), 0);
  EXPECT_EQ(CountFiles(cache_dir_, ".idxcache"), 1);
  DatasetCache next = Cache();
  absl::StatusOr<IdxData> data = next.ReadIdx(source_, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->mapped());
}

TEST_F(DatasetCacheTest, AStaleTemporaryIsRemovedAndAFreshOneKept) {
  const std::string entry = *Cache().EntryPath(source_);
  std::filesystem::create_directories(cache_dir_);
  WriteFile(entry + ".tmp-stale1", "left by a writer killed long ago");
  WriteFile(entry + ".tmp-fresh1", "another writer's, still being written");
  std::filesystem::last_write_time(entry + ".tmp-stale1",
                                   std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
  ASSERT_TRUE(Cache().ReadIdx(source_, 2).ok());
  EXPECT_FALSE(std::filesystem::exists(entry + ".tmp-stale1"));
  EXPECT_TRUE(std::filesystem::exists(entry + ".tmp-fresh1"));
}

TEST_F(DatasetCacheTest, ABadSourceFailsAsWithoutACacheAndWritesNothing) {
  DatasetCache cache = Cache();
  absl::Status missing = cache.ReadIdx(dir_ + "/nope.gz", 1).status();
  EXPECT_EQ(missing, ReadIdxFile(dir_ + "/nope.gz", 1).status());
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);

  const std::string truncated = dir_ + "/short-idx1-ubyte.gz";
  WriteGz(truncated, IdxBytes({4}, {1, 2}));
  EXPECT_EQ(cache.ReadIdx(truncated, 1).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(cache.stats().written, 0);
  EXPECT_FALSE(std::filesystem::exists(*cache.EntryPath(truncated)));
}

TEST_F(DatasetCacheTest, NoDirectoryMeansNoCache) {
  DatasetCache cache(DatasetCache::Options{});
  absl::StatusOr<IdxData> data = cache.ReadIdx(source_, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->mapped());
  EXPECT_EQ(Bytes(*data), pixels_);
  EXPECT_EQ(cache.stats().written, 0);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/cache"));
}

}  // namespace
}  // namespace fitrun::worker
