#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace fitrun::client {

size_t DisplayWidth(const std::string& text) {
  size_t width = 0;
  for (unsigned char c : text) {
    if ((c & 0xC0) != 0x80) ++width;
  }
  return width;
}

std::string TruncateToWidth(const std::string& text, int width) {
  if (width < 1 || DisplayWidth(text) <= static_cast<size_t>(width)) return text;
  // Keep width - 1 code points, then the ellipsis.
  size_t kept = 0;
  size_t end = 0;
  for (; end < text.size(); ++end) {
    if ((static_cast<unsigned char>(text[end]) & 0xC0) != 0x80) {
      if (kept == static_cast<size_t>(width - 1)) break;
      ++kept;
    }
  }
  return text.substr(0, end) + "…";
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const char* sign = bytes < 0 ? "-" : "";
  // Unsigned so that INT64_MIN still has a magnitude.
  const uint64_t magnitude =
      bytes < 0 ? uint64_t{0} - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  if (magnitude < 1024) return absl::StrCat(sign, magnitude, " B");
  double value = static_cast<double>(magnitude) / 1024.0;
  int unit = 0;
  // Move up a unit before rounding would print "1024.0 MiB".
  while (value >= 1023.95 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%s%.1f %s", sign, value, kUnits[unit]);
}

std::string FormatMiB(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string FormatShortDuration(absl::Duration duration) {
  if (duration < absl::ZeroDuration()) duration = absl::ZeroDuration();
  const int64_t total_seconds = absl::ToInt64Seconds(duration);
  const int64_t days = total_seconds / 86400;
  const int64_t hours = (total_seconds / 3600) % 24;
  const int64_t minutes = (total_seconds / 60) % 60;
  const int64_t seconds = total_seconds % 60;
  if (days > 0) return absl::StrFormat("%dd%02dh", days, hours);
  if (hours > 0) return absl::StrFormat("%dh%02dm", hours, minutes);
  if (minutes > 0) return absl::StrFormat("%dm%02ds", minutes, seconds);
  return absl::StrFormat("%ds", seconds);
}

std::string MemoryBar(int64_t used_bytes, int64_t total_bytes, int width) {
  width = std::max(width, 1);
  if (total_bytes <= 0) return absl::StrCat("[", std::string(width, '.'), "]  n/a");
  const double fraction =
      std::clamp(static_cast<double>(used_bytes) / static_cast<double>(total_bytes), 0.0, 1.0);
  const int filled = static_cast<int>(std::lround(fraction * width));
  return absl::StrFormat("[%s%s] %3d%%", std::string(filled, '#'), std::string(width - filled, '.'),
                         static_cast<int>(std::lround(fraction * 100)));
}

std::string Sparkline(const std::vector<double>& values, int width) {
  static constexpr const char* kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  constexpr int kLevels = static_cast<int>(std::size(kBlocks));
  std::vector<double> finite;
  finite.reserve(values.size());
  for (double value : values) {
    if (std::isfinite(value)) finite.push_back(value);
  }
  if (finite.empty() || width < 1) return "";
  const size_t n = finite.size();
  const auto [min_it, max_it] = std::minmax_element(finite.begin(), finite.end());
  const double low = *min_it;
  const double high = *max_it;

  std::vector<double> columns;
  if (n <= static_cast<size_t>(width)) {
    columns = finite;
  } else {
    const size_t count = static_cast<size_t>(width);
    // Column c covers values [begin(c), begin(c + 1)): every column at least one, none left over.
    auto begin = [&](size_t c) { return c * n / count; };
    auto column_of = [&](size_t index) {
      size_t c = index * count / n;
      while (c + 1 < count && begin(c + 1) <= index) ++c;
      while (c > 0 && begin(c) > index) --c;
      return c;
    };
    columns.resize(count);
    for (size_t c = 0; c < count; ++c) {
      double sum = 0;
      for (size_t i = begin(c); i < begin(c + 1); ++i) sum += finite[i];
      columns[c] = sum / static_cast<double>(begin(c + 1) - begin(c));
    }
    const size_t min_index = static_cast<size_t>(min_it - finite.begin());
    const size_t max_index = static_cast<size_t>(max_it - finite.begin());
    size_t min_column = column_of(min_index);
    size_t max_column = column_of(max_index);
    // Both extremes in one column: the later one moves to the next column (or the earlier one to
    // the previous), a one-column shift that keeps their order.
    if (min_column == max_column && count > 1) {
      size_t& later = min_index > max_index ? min_column : max_column;
      size_t& earlier = min_index > max_index ? max_column : min_column;
      if (later + 1 < count) {
        ++later;
      } else {
        --earlier;
      }
    }
    columns[min_column] = low;
    columns[max_column] = high;
  }

  std::string line;
  for (double value : columns) {
    const int level = high > low ? static_cast<int>(std::lround((value - low) / (high - low) * (kLevels - 1)))
                                 : kLevels / 2 - 1;
    line += kBlocks[std::clamp(level, 0, kLevels - 1)];
  }
  return line;
}

std::string FormatLoss(double loss) { return absl::StrFormat("%.4f", loss); }

std::vector<std::pair<std::string, std::string>> FormatMetrics(
    const google::protobuf::Map<std::string, double>& metrics) {
  std::vector<std::pair<std::string, std::string>> formatted;
  for (const auto& [name, value] : metrics) formatted.emplace_back(name, absl::StrFormat("%.4g", value));
  std::sort(formatted.begin(), formatted.end());
  return formatted;
}

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  if (name.empty()) return absl::StrCat("STATE_", static_cast<int>(state));
  return std::string(absl::StripPrefix(name, "JOB_STATE_"));
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string DeviceKindName(v1::DeviceKind kind) {
  switch (kind) {
    case v1::DEVICE_KIND_CPU:
      return "cpu";
    case v1::DEVICE_KIND_CUDA:
      return "cuda";
    default:
      return "?";
  }
}

absl::Time ToAbslTime(const google::protobuf::Timestamp& timestamp) {
  return absl::FromUnixSeconds(timestamp.seconds()) + absl::Nanoseconds(timestamp.nanos());
}

bool HasTime(const google::protobuf::Timestamp& timestamp) {
  return timestamp.seconds() != 0 || timestamp.nanos() != 0;
}

std::string FormatTable(const std::vector<TableColumn>& columns,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(columns.size(), 0);
  for (size_t c = 0; c < columns.size(); ++c) widths[c] = DisplayWidth(columns[c].title);
  for (const auto& row : rows) {
    for (size_t c = 0; c < columns.size() && c < row.size(); ++c) {
      widths[c] = std::max(widths[c], DisplayWidth(row[c]));
    }
  }

  std::string out;
  auto append_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < columns.size(); ++c) {
      const std::string empty;
      const std::string& cell = c < cells.size() ? cells[c] : empty;
      const std::string padding(widths[c] - DisplayWidth(cell), ' ');
      if (c > 0) line += "  ";
      if (columns[c].right_aligned) {
        absl::StrAppend(&line, padding, cell);
      } else {
        absl::StrAppend(&line, cell, padding);
      }
    }
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, line, "\n");
  };

  std::vector<std::string> header;
  header.reserve(columns.size());
  for (const auto& column : columns) header.push_back(column.title);
  append_row(header);
  for (const auto& row : rows) append_row(row);
  return out;
}

}  // namespace fitrun::client
