#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

TEST(FormatBytesTest, UsesBinaryUnitsWithOneDecimal) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatBytes(int64_t{24} << 30), "24.0 GiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 40), "5.0 TiB");
}

TEST(FormatBytesTest, MovesUpAUnitInsteadOfPrinting1024) {
  // 1024 MiB minus one byte would round to "1024.0 MiB".
  EXPECT_EQ(FormatBytes((int64_t{1} << 30) - 1), "1.0 GiB");
}

TEST(FormatBytesTest, HandlesNegativeAndExtremeValues) {
  EXPECT_EQ(FormatBytes(-2048), "-2.0 KiB");
  EXPECT_EQ(FormatBytes(std::numeric_limits<int64_t>::max()), "8.0 EiB");
  EXPECT_EQ(FormatBytes(std::numeric_limits<int64_t>::min()), "-8.0 EiB");
}

TEST(FormatMiBTest, AlwaysInMiB) {
  EXPECT_EQ(FormatMiB(0), "0.0 MiB");
  EXPECT_EQ(FormatMiB(int64_t{3} << 19), "1.5 MiB");
  EXPECT_EQ(FormatMiB(int64_t{2} << 30), "2048.0 MiB");
}

TEST(FormatShortDurationTest, PicksTheTwoLargestUnits) {
  EXPECT_EQ(FormatShortDuration(absl::ZeroDuration()), "0s");
  EXPECT_EQ(FormatShortDuration(absl::Milliseconds(999)), "0s");
  EXPECT_EQ(FormatShortDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(FormatShortDuration(absl::Seconds(125)), "2m05s");
  EXPECT_EQ(FormatShortDuration(absl::Minutes(62) + absl::Seconds(30)), "1h02m");
  EXPECT_EQ(FormatShortDuration(absl::Hours(76)), "3d04h");
}

TEST(FormatShortDurationTest, ClampsNegativeToZero) {
  // A clock slightly behind the coordinator's makes a fresh job's age negative.
  EXPECT_EQ(FormatShortDuration(absl::Seconds(-3)), "0s");
}

TEST(MemoryBarTest, FillsCellsInProportion) {
  EXPECT_EQ(MemoryBar(0, 100, 10), "[..........]   0%");
  EXPECT_EQ(MemoryBar(25, 100, 20), "[#####...............]  25%");
  EXPECT_EQ(MemoryBar(100, 100, 10), "[##########] 100%");
}

TEST(MemoryBarTest, ClampsOutOfRangeUsage) {
  EXPECT_EQ(MemoryBar(150, 100, 4), "[####] 100%");
  EXPECT_EQ(MemoryBar(-5, 100, 4), "[....]   0%");
}

TEST(MemoryBarTest, UnknownTotalIsNotApplicable) {
  EXPECT_EQ(MemoryBar(10, 0, 4), "[....]  n/a");
}

TEST(StateNameTest, DropsTheProtoPrefix) {
  EXPECT_EQ(StateName(v1::JOB_STATE_SUCCEEDED), "SUCCEEDED");
  EXPECT_EQ(StateName(v1::JOB_STATE_RESTARTING), "RESTARTING");
  EXPECT_EQ(StateName(static_cast<v1::JobState>(42)), "STATE_42");
}

TEST(IsTerminalTest, OnlyTheThreeEndStates) {
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_FAILED));
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_CANCELLED));
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_RUNNING));
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_RESTARTING));
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_UNSPECIFIED));
}

TEST(DeviceKindNameTest, SpellsKindsAsDeviceIds) {
  EXPECT_EQ(DeviceKindName(v1::DEVICE_KIND_CPU), "cpu");
  EXPECT_EQ(DeviceKindName(v1::DEVICE_KIND_CUDA), "cuda");
  EXPECT_EQ(DeviceKindName(v1::DEVICE_KIND_UNSPECIFIED), "?");
}

TEST(ToAbslTimeTest, KeepsNanoseconds) {
  google::protobuf::Timestamp timestamp;
  EXPECT_FALSE(HasTime(timestamp));
  timestamp.set_seconds(1700000000);
  timestamp.set_nanos(500000000);
  EXPECT_TRUE(HasTime(timestamp));
  EXPECT_EQ(ToAbslTime(timestamp), absl::FromUnixMillis(int64_t{1700000000500}));
}

TEST(FormatTableTest, AlignsColumnsAndTrimsTrailingSpaces) {
  const std::string table = FormatTable({{"ID"}, {"NAME"}, {"LOSS", true}},
                                        {{"j-1", "mnist", "0.5000"}, {"j-10", "", "12.0000"}});
  EXPECT_EQ(table,
            "ID    NAME      LOSS\n"
            "j-1   mnist   0.5000\n"
            "j-10         12.0000\n");
}

TEST(FormatTableTest, LastLeftAlignedColumnHasNoTrailingPadding) {
  EXPECT_EQ(FormatTable({{"A"}, {"B"}}, {{"x", "longer"}, {"y", "z"}}),
            "A  B\n"
            "x  longer\n"
            "y  z\n");
}

TEST(FormatTableTest, CountsUtf8CharactersNotBytes) {
  EXPECT_EQ(FormatTable({{"NAME"}, {"N", true}}, {{"r\xC3\xA9sum\xC3\xA9", "1"}}),
            "NAME    N\n"
            "r\xC3\xA9sum\xC3\xA9  1\n");
}

TEST(FormatTableTest, MissingCellsAreBlank) {
  EXPECT_EQ(FormatTable({{"A"}, {"B"}}, {{"x"}}), "A  B\nx\n");
}

TEST(TruncateToWidthTest, CutsByCodePointsAndMarksTheCut) {
  EXPECT_EQ(TruncateToWidth("fashion-mnist", 20), "fashion-mnist");
  EXPECT_EQ(TruncateToWidth("fashion-mnist", 13), "fashion-mnist");
  EXPECT_EQ(TruncateToWidth("fashion-mnist", 8), "fashion…");
  EXPECT_EQ(TruncateToWidth("évaluée-ü", 4), "éva…");
  EXPECT_EQ(TruncateToWidth("abc", 1), "…");
  EXPECT_EQ(TruncateToWidth("abc", 0), "abc");
  EXPECT_EQ(DisplayWidth("▁▂▃ é"), 5u);
}

// Columns of a sparkline: every block character is one code point of three bytes.
std::vector<std::string> Columns(const std::string& sparkline) {
  std::vector<std::string> columns;
  for (size_t i = 0; i + 3 <= sparkline.size(); i += 3) columns.push_back(sparkline.substr(i, 3));
  EXPECT_EQ(sparkline.size() % 3, 0u) << sparkline;
  return columns;
}

TEST(SparklineTest, OneColumnPerValueFromLowestToHighest) {
  EXPECT_EQ(Sparkline({1, 2, 3, 4, 5, 6, 7, 8}, 60), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(Sparkline({8, 1, 4.5}, 60), "█▁▅");
}

TEST(SparklineTest, AFlatSeriesIsMidHeight) {
  EXPECT_EQ(Sparkline({0.7, 0.7, 0.7, 0.7}, 60), "▄▄▄▄");
}

TEST(SparklineTest, OnePointIsOneColumn) {
  EXPECT_EQ(Sparkline({2.3}, 60), "▄");
}

TEST(SparklineTest, SkipsNaNAndInfinities) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(Sparkline({1, nan, 2, inf, -inf}, 60), "▁█");
  EXPECT_EQ(Sparkline({nan, nan}, 60), "");
  EXPECT_EQ(Sparkline({}, 60), "");
  EXPECT_EQ(Sparkline({1, 2}, 0), "");
}

TEST(SparklineTest, ResamplingToTheWidthKeepsTheMinimumAndMaximumVisible) {
  // 1,200 points near 5 (20 to a column) with one spike and one dip, each a single point that a
  // column's mean would flatten into its neighbours.
  std::vector<double> values(1200);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 5 + 0.01 * static_cast<double>(i % 7);
  values[333] = 50;
  values[777] = -40;
  const std::vector<std::string> columns = Columns(Sparkline(values, 60));
  ASSERT_EQ(columns.size(), 60u);
  EXPECT_EQ(columns[333 / 20], "█");
  EXPECT_EQ(columns[777 / 20], "▁");
  EXPECT_EQ(std::count(columns.begin(), columns.end(), "█"), 1);
  EXPECT_EQ(std::count(columns.begin(), columns.end(), "▁"), 1);
}

TEST(SparklineTest, ExtremesFallingInOneColumnStillBothShow) {
  // 120 points into 60 columns: the spike and the dip are neighbours in the same column.
  std::vector<double> values(120, 1.0);
  values[40] = 9;
  values[41] = -7;
  const std::vector<std::string> columns = Columns(Sparkline(values, 60));
  ASSERT_EQ(columns.size(), 60u);
  EXPECT_EQ(columns[20], "█");
  EXPECT_EQ(columns[21], "▁");
  // At the last column the earlier extreme moves back instead.
  values.assign(120, 1.0);
  values[118] = 9;
  values[119] = -7;
  const std::vector<std::string> last = Columns(Sparkline(values, 60));
  EXPECT_EQ(last[58], "█");
  EXPECT_EQ(last[59], "▁");
}

TEST(SparklineTest, ADecreasingLossResampledStaysDecreasing) {
  std::vector<double> loss;
  for (int step = 1; step <= 500; ++step) loss.push_back(2.3 / std::sqrt(static_cast<double>(step)));
  const std::vector<std::string> columns = Columns(Sparkline(loss, 40));
  ASSERT_EQ(columns.size(), 40u);
  EXPECT_EQ(columns.front(), "█");
  EXPECT_EQ(columns.back(), "▁");
  EXPECT_TRUE(std::is_sorted(columns.rbegin(), columns.rend())) << Sparkline(loss, 40);
}

}  // namespace
}  // namespace fitrun::client
