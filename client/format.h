// Plain text formatting shared by every fitrun command: sizes, durations, memory bars and tables.
// Pure functions with no I/O, so the CLI's output can be tested without a coordinator.
#ifndef FITRUN_CLIENT_FORMAT_H_
#define FITRUN_CLIENT_FORMAT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace fitrun::client {

// Binary units with one decimal ("512 B", "1.5 GiB"), the units device memory is sold and capped in.
std::string FormatBytes(int64_t bytes);

// Always in MiB ("412.3 MiB") so the lines of a memory breakdown compare at a glance.
std::string FormatMiB(int64_t bytes);

// Compact and coarse ("45s", "2m05s", "1h02m", "3d04h"): for ETAs and ages, where seconds stop
// mattering once hours are involved. Negative durations print as "0s".
std::string FormatShortDuration(absl::Duration duration);

// "[#####...............]  25%": used/total as a bar of `width` cells, rounded to the nearest cell.
// A device that reports no total memory draws an empty bar with "n/a".
std::string MemoryBar(int64_t used_bytes, int64_t total_bytes, int width = 20);

// `values` as a row of the eight block characters ▁▂▃▄▅▆▇█, from the lowest to the highest value;
// NaN and infinities are skipped. More values than `width` columns are resampled: a column shows
// the mean of the values it covers, except that the columns holding the lowest and the highest
// value show those, so a spike or a dip never averages away. A flat series draws mid-height bars.
// Empty when no value is finite or width < 1.
std::string Sparkline(const std::vector<double>& values, int width);

// Loss with four decimals, enough to see training move without the noise of a full double.
std::string FormatLoss(double loss);

// A workload's named figures, sorted by name, each with four significant digits:
// {{"ndcg@10", 0.61}, {"hr@10", 0.9}} -> {{"hr@10", "0.9"}, {"ndcg@10", "0.61"}}.
std::vector<std::pair<std::string, std::string>> FormatMetrics(
    const google::protobuf::Map<std::string, double>& metrics);

// "SUCCEEDED" rather than "JOB_STATE_SUCCEEDED": the prefix is proto namespacing, not information.
std::string StateName(v1::JobState state);
bool IsTerminal(v1::JobState state);

// "cpu", "cuda", as device ids spell them.
std::string DeviceKindName(v1::DeviceKind kind);

absl::Time ToAbslTime(const google::protobuf::Timestamp& timestamp);
bool HasTime(const google::protobuf::Timestamp& timestamp);

// Columns `text` takes on a terminal: its code points, so accented names and block characters
// count once.
size_t DisplayWidth(const std::string& text);

// `text` cut to at most `width` columns (code points), the last one "…" when something was cut.
// A width below 1 means no limit.
std::string TruncateToWidth(const std::string& text, int width);

// A column-aligned table: a header row and data rows, columns separated by two spaces. Columns
// listed in `right_aligned` (by index) are padded on the left, for numbers. Trailing spaces are
// trimmed so piped output diffs cleanly.
struct TableColumn {
  std::string title;
  bool right_aligned = false;
};
std::string FormatTable(const std::vector<TableColumn>& columns,
                        const std::vector<std::vector<std::string>>& rows);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_FORMAT_H_
