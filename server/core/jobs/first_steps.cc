#include "server/core/jobs/first_steps.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/units.h"

namespace fitrun::server {

std::optional<FirstStepsPeak> MeasuredInFirstSteps(const ActiveAttempt& attempt, const fitrun::v1::Plan& plan) {
  if (attempt.out_of_memory || attempt.ranks.empty()) return std::nullopt;
  const int64_t enough = std::max<int64_t>(1, plan.total_steps() > 0 ? std::min(kFirstSteps, plan.total_steps())
                                                                      : kFirstSteps);
  FirstStepsPeak measured{plan.per_device_batch(), 0};
  for (const RankState& rank : attempt.ranks) {
    if (rank.peak_bytes <= 0 || (rank.last_step < enough && !rank.finished)) return std::nullopt;
    measured.peak_bytes = std::max(measured.peak_bytes, rank.peak_bytes);
  }
  return measured;
}

std::optional<FirstStepsPeak> FirstStepsDue(const JobEntry& entry) {
  if (!entry.active || entry.active->first_steps_measured) return std::nullopt;
  const fitrun::v1::Job& job = entry.record.job;
  if (!job.spec().has_script() || job.state() != fitrun::v1::JOB_STATE_RUNNING) return std::nullopt;
  return MeasuredInFirstSteps(*entry.active, job.plan());
}

bool WorthMovingTo(const fitrun::v1::Plan& running, const fitrun::v1::Plan& replanned) {
  if (replanned.device_ids_size() != running.device_ids_size()) return false;
  for (int i = 0; i < running.device_ids_size(); ++i) {
    if (replanned.device_ids(i) != running.device_ids(i)) return false;
  }
  return replanned.per_device_batch() > running.per_device_batch() &&
         replanned.activation_checkpointing() == running.activation_checkpointing() &&
         replanned.zero_stage() == running.zero_stage();
}

std::string DescribeFirstSteps(int attempt, const FirstStepsPeak& measured, const fitrun::v1::Plan& running,
                               const fitrun::v1::Plan* move_to) {
  std::string text = absl::StrCat("memory: attempt ", attempt, "'s first steps peaked at ",
                                  FormatBytes(measured.peak_bytes), " at per-device batch ", measured.per_device_batch,
                                  running.usable_bytes() > 0
                                      ? absl::StrCat(" (", FormatBytes(running.usable_bytes()), " usable)")
                                      : "",
                                  "; recorded for the plans after it");
  if (move_to == nullptr) return absl::StrCat(text, "; the plan keeps its batch");
  return absl::StrCat(text, "; with it the plan takes per-device batch ", move_to->per_device_batch(), " x ",
                      move_to->grad_accum_steps(), " accumulation (predicted peak ",
                      FormatBytes(move_to->predicted().total_bytes()), ") instead of ", running.per_device_batch(),
                      " x ", running.grad_accum_steps(),
                      ": moving there at the next checkpoint (one restart, resuming from it)");
}

}  // namespace fitrun::server
