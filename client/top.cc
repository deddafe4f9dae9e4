#include "client/top.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/format.h"

namespace fitrun::client {
namespace {

// Job names are the user's; a long one would push every other column off the screen.
constexpr int kNameColumns = 24;

int StateOrder(v1::JobState state) {
  const std::vector<v1::JobState> order = TopJobStates();
  const auto it = std::find(order.begin(), order.end(), state);
  return static_cast<int>(it - order.begin());
}

std::string SizeOrDash(int64_t bytes) { return bytes > 0 ? FormatBytes(bytes) : "-"; }

// Below 100 samples/s the decimal still says something.
std::string FormatSamplesPerSecond(double rate) {
  if (rate <= 0) return "-";
  return rate < 100 ? absl::StrFormat("%.1f", rate) : absl::StrFormat("%.0f", rate);
}

std::string FormatStepTime(double seconds) {
  if (seconds <= 0) return "-";
  if (seconds < 0.01) return absl::StrFormat("%.1f ms", seconds * 1000);
  if (seconds < 1) return absl::StrFormat("%.0f ms", seconds * 1000);
  return absl::StrFormat("%.2f s", seconds);
}

std::string Header(const RenderContext& context) {
  return absl::StrCat("fitrun top  ", absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", context.now, context.zone));
}

std::string DeviceTable(const v1::ListDevicesResponse& response) {
  if (response.devices().empty()) return "no devices\n";
  std::vector<std::vector<std::string>> rows;
  for (const v1::Device& device : response.devices()) {
    const bool held = !device.job_id().empty();
    rows.push_back({
        device.id(),
        device.name(),
        FormatBytes(device.total_bytes()),
        FormatBytes(device.free_bytes()),
        held ? SizeOrDash(device.planned_bytes()) : "-",
        held ? SizeOrDash(device.peak_bytes()) : "-",
        TopMemoryBar(device),
        held ? absl::StrCat(device.job_id(), " rank ", device.rank()) : "-",
    });
  }
  // The id names the kind ("cpu:0", "cuda:1").
  return FormatTable({{"DEVICE"},
                      {"NAME"},
                      {"TOTAL", true},
                      {"FREE", true},
                      {"PLANNED", true},
                      {"PEAK", true},
                      {"MEMORY"},
                      {"JOB"}},
                     rows);
}

std::string JobTable(std::vector<const v1::Job*> jobs) {
  if (jobs.empty()) return "no running, restarting, planning or queued jobs\n";
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const v1::Job* a, const v1::Job* b) { return StateOrder(a->state()) < StateOrder(b->state()); });
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job* job : jobs) {
    const v1::Plan& plan = job->plan();
    const v1::Progress& progress = job->last_progress();
    const bool has_plan = plan.device_ids_size() > 0;
    const bool has_progress = progress.step() > 0;
    std::string step = "-";
    if (has_progress) {
      step = progress.total_steps() > 0 ? absl::StrCat(progress.step(), "/", progress.total_steps())
                                        : absl::StrCat(progress.step());
    }
    // last_progress is rank 0's, and a rank reports only its own samples; DDP ranks step together,
    // so the job's rate is rank 0's times the ranks.
    const double job_rate = progress.samples_per_second() * std::max(plan.device_ids_size(), 1);
    // Built-in ranks report the step time with the share; without it the share means nothing.
    const bool has_step_time = has_progress && progress.step_seconds() > 0;
    rows.push_back({
        job->id(),
        TruncateToWidth(job->spec().name(), kNameColumns),
        job->owner().empty() ? "-" : job->owner(),
        StateName(job->state()),
        step,
        has_progress ? FormatLoss(progress.loss()) : "-",
        has_progress ? FormatSamplesPerSecond(job_rate) : "-",
        has_step_time ? FormatStepTime(progress.step_seconds()) : "-",
        has_step_time ? absl::StrFormat("%.0f%%", 100 * progress.exposed_communication_share()) : "-",
        has_plan ? absl::StrCat(plan.per_device_batch(), "x", plan.grad_accum_steps(), "x", plan.device_ids_size())
                 : "-",
        job->attempts() > 0 ? absl::StrCat(job->attempts()) : "-",
    });
  }
  return FormatTable({{"JOB"},
                      {"NAME"},
                      {"OWNER"},
                      {"STATE"},
                      {"STEP", true},
                      {"LOSS", true},
                      {"SAMPLES/S", true},
                      {"STEP TIME", true},
                      {"COMM", true},
                      {"BATCH", true},
                      {"ATTEMPTS", true}},
                     rows);
}

std::string JobCounts(const v1::ListJobsResponse& response) {
  std::map<int, int> by_state;
  for (const v1::Job& job : response.jobs()) ++by_state[StateOrder(job.state())];
  std::vector<std::string> parts;
  const std::vector<v1::JobState> states = TopJobStates();
  for (const auto& [order, count] : by_state) {
    const std::string name = order < static_cast<int>(states.size())
                                 ? absl::AsciiStrToLower(StateName(states[order]))
                                 : "other";
    parts.push_back(absl::StrCat(count, " ", name));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// Applies the layout: every line cut to the width, and a frame taller than the screen cut short.
std::string Fit(const std::string& frame, const TopLayout& layout) {
  std::vector<std::string> lines = absl::StrSplit(frame, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (layout.rows > 0 && lines.size() > static_cast<size_t>(layout.rows)) {
    const size_t kept = static_cast<size_t>(std::max(layout.rows - 1, 0));
    const size_t left_out = lines.size() - kept;
    lines.resize(kept);
    lines.push_back(absl::StrCat("... ", left_out, " more lines (a taller terminal, or fitrun top --once | less)"));
  }
  std::string out;
  for (const std::string& line : lines) absl::StrAppend(&out, TruncateToWidth(line, layout.columns), "\n");
  return out;
}

}  // namespace

std::vector<v1::JobState> TopJobStates() {
  return {v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING, v1::JOB_STATE_PLANNING, v1::JOB_STATE_QUEUED};
}

std::string TopMemoryBar(const v1::Device& device, int width) {
  width = std::max(width, 1);
  const int64_t total = device.total_bytes();
  if (total <= 0) return absl::StrCat("[", std::string(width, '.'), "]");
  auto cells = [&](int64_t bytes) {
    const double fraction = std::clamp(static_cast<double>(bytes) / static_cast<double>(total), 0.0, 1.0);
    return static_cast<int>(std::lround(fraction * width));
  };
  std::string bar(width, '.');
  if (!device.job_id().empty() && device.planned_bytes() > 0) {
    const int planned = cells(device.planned_bytes());
    const int peak = cells(device.peak_bytes());
    for (int i = 0; i < peak; ++i) bar[i] = i < planned ? '#' : '!';
    // The cell where the prediction ends; a plan under half a cell still shows in the first.
    bar[std::clamp(planned - 1, 0, width - 1)] = '|';
  } else {
    // Not every source reports used memory directly; total - free is what a job could not have.
    const int64_t used = device.used_bytes() > 0 ? device.used_bytes() : std::max<int64_t>(total - device.free_bytes(), 0);
    const int filled = cells(used);
    for (int i = 0; i < filled; ++i) bar[i] = '#';
  }
  return absl::StrCat("[", bar, "]");
}

std::string RenderTop(const TopSnapshot& snapshot, const RenderContext& context, const TopLayout& layout) {
  int held = 0;
  for (const v1::Device& device : snapshot.devices.devices()) held += device.job_id().empty() ? 0 : 1;
  std::vector<const v1::Job*> jobs;
  for (const v1::Job& job : snapshot.jobs.jobs()) jobs.push_back(&job);

  std::string frame = absl::StrCat(Header(context), "  devices: ", snapshot.devices.devices_size(), " (", held,
                                   " held)  jobs: ", JobCounts(snapshot.jobs), "\n\n");
  absl::StrAppend(&frame, DeviceTable(snapshot.devices), "\n", JobTable(std::move(jobs)), "\n");
  absl::StrAppend(&frame,
                  "MEMORY of TOTAL: # peak (in use if idle), ! peak beyond PLANNED, | PLANNED\n"
                  "BATCH: per-device batch x accumulation x devices\n"
                  "COMM: share of the step time blocked on communication\n");
  return Fit(frame, layout);
}

std::string RenderTopUnavailable(const std::string& why, const RenderContext& context, const TopLayout& layout) {
  return Fit(absl::StrCat(Header(context), "\n\ncoordinator unreachable: ", why, "\n(retrying)\n"), layout);
}

}  // namespace fitrun::client
