#include "client/watch_state.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/format.h"

namespace fitrun::client {
namespace {

std::string FormatRate(double samples_per_second) {
  // Below 100 samples/s the decimal still says something.
  if (samples_per_second < 100) return absl::StrFormat("%.1f samples/s", samples_per_second);
  return absl::StrFormat("%.0f samples/s", samples_per_second);
}

std::vector<std::string> DescribeStateChanged(const v1::StateChanged& changed) {
  std::string line = changed.from() == v1::JOB_STATE_UNSPECIFIED
                         ? absl::StrCat("state: ", StateName(changed.to()))
                         : absl::StrCat("state: ", StateName(changed.from()), " -> ",
                                        StateName(changed.to()));
  if (!changed.reason().empty()) absl::StrAppend(&line, " (", changed.reason(), ")");
  return {line};
}

std::vector<std::string> DescribeOom(const v1::OutOfMemory& oom) {
  std::string line = absl::StrFormat("rank %d: out of memory %s (per-device batch %d)", oom.rank(),
                                     oom.step() > 0 ? absl::StrCat("at step ", oom.step())
                                                    : std::string("before its first reported step"),
                                     oom.per_device_batch());
  if (oom.requested_bytes() > 0) {
    absl::StrAppend(&line, ": requested ", FormatBytes(oom.requested_bytes()));
  }
  absl::StrAppend(&line, ", live ", FormatBytes(oom.live_bytes()), ", peak ",
                  FormatBytes(oom.peak_bytes()));
  if (oom.cap_bytes() > 0) absl::StrAppend(&line, ", cap ", FormatBytes(oom.cap_bytes()));
  return {line};
}

std::vector<std::string> DescribeHostMemoryOom(const v1::HostMemoryOom& oom) {
  std::string line = absl::StrFormat("host memory: the kernel's OOM killer stopped a process of attempt %d (seen as "
                                     "rank %d exited)",
                                     oom.attempt(), oom.rank());
  if (oom.limit_bytes() > 0) absl::StrAppend(&line, ": its ranks' limit is ", FormatBytes(oom.limit_bytes()));
  if (oom.peak_bytes() > 0) absl::StrAppend(&line, ", peak ", FormatBytes(oom.peak_bytes()));
  absl::StrAppend(&line, " (per-device batch ", oom.per_device_batch(), "; spec.resources.host_memory raises it)");
  return {line};
}

std::vector<std::string> DescribeLog(const v1::LogLine& log) {
  // The coordinator's own lines carry no rank.
  const std::string who = log.rank() < 0 ? "fitrund" : absl::StrCat("rank ", log.rank());
  std::vector<std::string> lines;
  for (absl::string_view text : absl::StrSplit(log.text(), '\n', absl::SkipEmpty())) {
    lines.push_back(absl::StrCat(who, ": ", text));
  }
  return lines;
}

// Training goes on without the checkpoint, so the line says what a failure would now cost: a
// restart resumes from the previous checkpoint, redoing the steps since.
std::vector<std::string> DescribeCheckpointFailed(const v1::CheckpointFailed& failed) {
  std::vector<std::string> error_lines = absl::StrSplit(failed.error(), '\n', absl::SkipEmpty());
  std::string line = absl::StrFormat("checkpoint FAILED: rank %d could not save step %d", failed.rank(), failed.step());
  if (!error_lines.empty()) absl::StrAppend(&line, ": ", error_lines.front());
  absl::StrAppend(&line, " (training goes on; a restart would resume from the previous checkpoint)");
  std::vector<std::string> lines = {line};
  for (size_t i = 1; i < error_lines.size(); ++i) lines.push_back(absl::StrCat("  | ", error_lines[i]));
  return lines;
}

std::vector<std::string> DescribeRankFinished(const v1::RankFinished& finished) {
  // A script that reports no progress leaves steps and loss unknown, not zero.
  std::string line = finished.steps() > 0 ? absl::StrFormat("rank %d finished: %d steps, loss %s", finished.rank(),
                                                            finished.steps(), FormatLoss(finished.final_loss()))
                                          : absl::StrFormat("rank %d finished", finished.rank());
  if (finished.has_test_accuracy()) {
    absl::StrAppend(&line, absl::StrFormat(", test accuracy %.4f", finished.test_accuracy()));
  }
  for (const auto& [name, value] : FormatMetrics(finished.metrics())) absl::StrAppend(&line, ", ", name, " ", value);
  return {line};
}

std::vector<std::string> DescribeRankExited(const v1::RankExited& exited) {
  std::vector<std::string> lines;
  if (exited.signal() != 0) {
    lines.push_back(absl::StrFormat("rank %d killed by signal %d", exited.rank(), exited.signal()));
  } else if (exited.exit_code() == 0) {
    lines.push_back(absl::StrFormat("rank %d exited cleanly", exited.rank()));
  } else {
    lines.push_back(
        absl::StrFormat("rank %d exited with code %d", exited.rank(), exited.exit_code()));
  }
  // The tail is what explains a failure; a clean exit's tail is noise.
  if (exited.signal() != 0 || exited.exit_code() != 0) {
    for (absl::string_view text : absl::StrSplit(exited.log_tail(), '\n', absl::SkipEmpty())) {
      lines.push_back(absl::StrCat("  | ", text));
    }
  }
  return lines;
}

}  // namespace

std::string DescribePlan(const v1::Plan& plan) {
  std::string line = absl::StrFormat(
      "%d device%s (%s), per-device batch %d, grad accum %d, lr %g", plan.device_ids_size(),
      plan.device_ids_size() == 1 ? "" : "s", absl::StrJoin(plan.device_ids(), ", "),
      plan.per_device_batch(), plan.grad_accum_steps(), plan.learning_rate());
  if (plan.nodes_size() > 0) {
    absl::StrAppend(&line, ", on ", plan.nodes_size(), " node", plan.nodes_size() == 1 ? "" : "s", " x ",
                    plan.devices_per_node(), " (", absl::StrJoin(plan.nodes(), ", "), ")");
  }
  if (plan.zero_stage() == 1) absl::StrAppend(&line, ", optimizer states sharded");
  if (plan.activation_checkpointing()) absl::StrAppend(&line, ", activations recomputed");
  if (plan.has_predicted() && plan.predicted().total_bytes() > 0) {
    absl::StrAppend(&line, ", predicted peak ", FormatMiB(plan.predicted().total_bytes()));
  }
  return line;
}

std::vector<std::string> WatchState::Apply(const v1::JobEvent& event, absl::Time received_at) {
  if (event.sequence() > 0 && event.sequence() <= last_sequence_) return {};
  last_sequence_ = std::max(last_sequence_, event.sequence());
  const absl::Time event_time = HasTime(event.time()) ? ToAbslTime(event.time()) : received_at;

  switch (event.event_case()) {
    case v1::JobEvent::kStateChanged: {
      state_ = event.state_changed().to();
      if (state_ == v1::JOB_STATE_RESTARTING) ResetProgress();
      return DescribeStateChanged(event.state_changed());
    }
    case v1::JobEvent::kPlanChosen: {
      plan_ = event.plan_chosen().plan();
      ResetProgress();
      return {absl::StrFormat("plan (attempt %d): %s", event.plan_chosen().attempt(),
                              DescribePlan(plan_))};
    }
    case v1::JobEvent::kProgress: {
      latest_by_rank_[event.progress().rank()] = event.progress();
      RecordStep(event_time);
      return {};
    }
    case v1::JobEvent::kOom:
      return DescribeOom(event.oom());
    case v1::JobEvent::kCheckpointSaved: {
      const v1::CheckpointSaved& saved = event.checkpoint_saved();
      std::string line = absl::StrFormat("checkpoint: step %d saved to %s (%s", saved.step(), saved.path(),
                                         FormatBytes(saved.bytes()));
      if (saved.seconds() > 0) absl::StrAppend(&line, absl::StrFormat(" in %.2fs", saved.seconds()));
      return {line + ")"};
    }
    case v1::JobEvent::kCheckpointFailed:
      return DescribeCheckpointFailed(event.checkpoint_failed());
    case v1::JobEvent::kHostMemoryOom:
      return DescribeHostMemoryOom(event.host_memory_oom());
    case v1::JobEvent::kLog:
      return DescribeLog(event.log());
    case v1::JobEvent::kRankFinished:
      return DescribeRankFinished(event.rank_finished());
    case v1::JobEvent::kRankExited:
      return DescribeRankExited(event.rank_exited());
    case v1::JobEvent::kMissed: {
      const v1::EventsMissed& missed = event.missed();
      last_sequence_ = std::max(last_sequence_, missed.last_sequence());
      return {absl::StrFormat(
          "missed events %d..%d: this watcher fell behind the job (progress may jump)",
          missed.first_sequence(), missed.last_sequence())};
    }
    case v1::JobEvent::EVENT_NOT_SET:
      return {};
  }
  return {};
}

AggregateProgress WatchState::progress() const {
  AggregateProgress aggregate;
  aggregate.world_size = plan_.device_ids_size();
  aggregate.total_steps = plan_.total_steps();
  aggregate.ranks_reporting = static_cast<int>(latest_by_rank_.size());
  bool first = true;
  for (const auto& [rank, progress] : latest_by_rank_) {
    if (first || progress.step() < aggregate.step) {
      aggregate.step = progress.step();
      aggregate.epoch = progress.epoch();
    }
    first = false;
    aggregate.total_steps = std::max(aggregate.total_steps, progress.total_steps());
    aggregate.samples_per_second += progress.samples_per_second();
    if (rank == 0) {
      aggregate.has_loss = true;
      aggregate.loss = progress.loss();
      aggregate.metrics = FormatMetrics(progress.metrics());
    }
  }
  if (std::optional<double> rate = StepsPerSecond(); rate.has_value() && aggregate.total_steps > 0) {
    const int64_t remaining = std::max<int64_t>(aggregate.total_steps - aggregate.step, 0);
    aggregate.eta = absl::Seconds(static_cast<double>(remaining) / *rate);
  }
  return aggregate;
}

std::string WatchState::ProgressLine() const {
  if (!has_progress()) return "";
  const AggregateProgress p = progress();
  std::string line;
  if (p.total_steps > 0) {
    line = absl::StrFormat("step %d/%d (%.1f%%)", p.step, p.total_steps,
                           100.0 * static_cast<double>(p.step) / static_cast<double>(p.total_steps));
  } else {
    line = absl::StrFormat("step %d", p.step);
  }
  absl::StrAppend(&line, "  epoch ", p.epoch);
  if (p.has_loss) absl::StrAppend(&line, "  loss ", FormatLoss(p.loss));
  for (const auto& [name, value] : p.metrics) absl::StrAppend(&line, "  ", name, " ", value);
  absl::StrAppend(&line, "  ", FormatRate(p.samples_per_second));
  absl::StrAppend(&line, "  ETA ", p.eta.has_value() ? FormatShortDuration(*p.eta) : "--");
  // Until every rank has reported, the aggregate covers only some of them; say so.
  if (p.world_size > 0 && p.ranks_reporting < p.world_size) {
    absl::StrAppend(&line, absl::StrFormat("  (%d/%d ranks)", p.ranks_reporting, p.world_size));
  }
  return line;
}

void WatchState::ResetProgress() {
  latest_by_rank_.clear();
  step_samples_.clear();
}

void WatchState::RecordStep(absl::Time time) {
  const int64_t step = progress().step;
  if (!step_samples_.empty()) {
    const auto& [last_time, last_step] = step_samples_.back();
    // A step going backwards means the ranks resumed from a checkpoint: the old rate is stale.
    if (step < last_step || time < last_time) step_samples_.clear();
    else if (step == last_step) return;
  }
  step_samples_.emplace_back(time, step);
  while (step_samples_.size() > 2 && step_samples_.front().first < time - kRateWindow) {
    step_samples_.pop_front();
  }
}

std::optional<double> WatchState::StepsPerSecond() const {
  if (step_samples_.size() < 2) return std::nullopt;
  const auto& [first_time, first_step] = step_samples_.front();
  const auto& [last_time, last_step] = step_samples_.back();
  const double seconds = absl::ToDoubleSeconds(last_time - first_time);
  if (seconds <= 0 || last_step <= first_step) return std::nullopt;
  return static_cast<double>(last_step - first_step) / seconds;
}

}  // namespace fitrun::client
