#include "server/core/calibration/device_costs_book.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace {

// Runs kept per GPU model and setting (the plan takes the highest of them, kCostsMargin above).
constexpr size_t kRunsKept = 16;

// Tabs and newlines would break a line of the file.
std::string Field(const std::string& text) {
  std::string out = text;
  std::replace_if(out.begin(), out.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCostsBook>> DeviceCostsBook::Create(std::string path) {
  std::unique_ptr<DeviceCostsBook> book(new DeviceCostsBook(std::move(path)));
  if (book->path_.empty()) return book;
  std::ifstream in(book->path_);
  std::string line;
  absl::MutexLock lock(&book->mu_);
  // "run <device name> <allocator config> <allocated> <reserved> <device> [<account>]"; a line that
  // does not read so (a torn last line after a crash) is skipped.
  while (std::getline(in, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    GpuRunPeaks peaks;
    if ((fields.size() != 6 && fields.size() != 7) || fields[0] != "run" ||
        !absl::SimpleAtoi(fields[3], &peaks.allocated_bytes) || !absl::SimpleAtoi(fields[4], &peaks.reserved_bytes) ||
        !absl::SimpleAtoi(fields[5], &peaks.device_bytes)) {
      continue;
    }
    book->RememberLocked({fields.size() == 7 ? fields[6] : "", fields[1], fields[2]}, peaks);
  }
  return book;
}

void DeviceCostsBook::RememberLocked(const Key& key, const GpuRunPeaks& peaks) {
  std::deque<GpuRunPeaks>& runs = runs_[key];
  runs.push_back(peaks);
  while (runs.size() > kRunsKept) runs.pop_front();
}

void DeviceCostsBook::RecordRun(const std::string& run_as, const std::string& device_name,
                                const std::string& allocator_config, const GpuRunPeaks& peaks) {
  if (peaks.allocated_bytes <= 0 || peaks.reserved_bytes < peaks.allocated_bytes ||
      peaks.device_bytes < peaks.reserved_bytes) {
    return;
  }
  absl::MutexLock lock(&mu_);
  RememberLocked({run_as, device_name, allocator_config}, peaks);
  if (path_.empty()) return;
  // One appended line per run: a crash tears at most the last, which the reader skips.
  if (FILE* file = std::fopen(path_.c_str(), "a")) {
    std::fprintf(file, "run\t%s\t%s\t%lld\t%lld\t%lld\t%s\n", Field(device_name).c_str(),
                 Field(allocator_config).c_str(), static_cast<long long>(peaks.allocated_bytes),
                 static_cast<long long>(peaks.reserved_bytes), static_cast<long long>(peaks.device_bytes),
                 Field(run_as).c_str());
    std::fclose(file);
  }
}

DeviceCosts DeviceCostsBook::CostsFor(const std::string& run_as, const std::string& device_name,
                                      const std::string& allocator_config) const {
  DeviceCosts costs = DefaultCudaCosts(allocator_config);
  absl::MutexLock lock(&mu_);
  auto it = runs_.find({run_as, device_name, allocator_config});
  if (it == runs_.end() || it->second.empty()) return costs;
  double ratio = 1.0;
  int64_t outside = 0;
  for (const GpuRunPeaks& run : it->second) {
    ratio = std::max(ratio, static_cast<double>(run.reserved_bytes) / static_cast<double>(run.allocated_bytes));
    outside = std::max(outside, run.device_bytes - run.reserved_bytes);
  }
  costs.reserve_ratio = ratio * kCostsMargin;
  // The process's footprint outside the allocator comes as one figure; the plan's three lines keep
  // the defaults' proportions.
  const int64_t learned_outside = static_cast<int64_t>(std::ceil(static_cast<double>(outside) * kCostsMargin));
  const double scale = static_cast<double>(learned_outside) / static_cast<double>(costs.outside_allocator_bytes());
  costs.context_bytes = static_cast<int64_t>(std::ceil(static_cast<double>(costs.context_bytes) * scale));
  costs.library_workspace_bytes =
      static_cast<int64_t>(std::ceil(static_cast<double>(costs.library_workspace_bytes) * scale));
  costs.communication_bytes = learned_outside - costs.context_bytes - costs.library_workspace_bytes;
  costs.source = absl::StrFormat(
      "%d run(s) on %s with PYTORCH_CUDA_ALLOC_CONF=%s: the allocator kept up to %.2fx what it handed out and "
      "the process %s outside it (each 3%% above)",
      it->second.size(), device_name, allocator_config.empty() ? "unset" : allocator_config, ratio,
      FormatBytes(outside));
  return costs;
}

}  // namespace fitrun::server
