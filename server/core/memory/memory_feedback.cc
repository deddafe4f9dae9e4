#include "server/core/memory/memory_feedback.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/units.h"

namespace fitrun::server {

int64_t MemoryNeededAt(const fitrun::v1::OutOfMemory& oom) {
  return std::max(oom.peak_bytes(), oom.live_bytes() + oom.requested_bytes());
}

PlanLimits LimitsAfterOutOfMemory(const OutOfMemoryHistory& history) {
  PlanLimits limits;
  const auto tighten = [](int64_t& bound, int64_t at_most) {
    // A batch of 1 that ran out of memory leaves nothing below it; 0 would mean "no bound".
    at_most = std::max<int64_t>(at_most, 1);
    if (bound == 0 || at_most < bound) bound = at_most;
  };
  for (const fitrun::v1::OutOfMemory& oom : history) {
    const int64_t b = oom.per_device_batch();
    if (b <= 0) continue;
    // The form the ranks ran: only batches below the one that ran out. The other form may still take
    // that batch (recomputing needs less than keeping at the same batch; the other way round its
    // figures are its own), but nothing says a larger one fits after an error.
    const bool recomputing = oom.activation_checkpointing();
    tighten(recomputing ? limits.max_per_device_batch_recomputing : limits.max_per_device_batch, b - 1);
    tighten(recomputing ? limits.max_per_device_batch : limits.max_per_device_batch_recomputing, b);
  }
  return limits;
}

ModelProfile ProfileAfterOutOfMemory(ModelProfile model, const fitrun::v1::JobSpec& spec,
                                     const OutOfMemoryHistory& history, const EstimatorOptions& estimator) {
  if (model.recomputing != nullptr) {
    model.recomputing =
        std::make_shared<const ModelProfile>(ProfileAfterOutOfMemory(*model.recomputing, spec, history, estimator));
  }
  for (const fitrun::v1::OutOfMemory& oom : history) {
    const int64_t b = oom.per_device_batch();
    if (b <= 0) continue;
    // An error of ranks that kept their activations says nothing of a model recomputing them, and
    // the other way round.
    if (oom.activation_checkpointing() != model.activation_checkpointing) continue;
    if (model.Unmeasured()) {
      // Nothing measured it before it ran out: what it needed is all the plan knows, taken as growing
      // with the batch (smaller batches are judged by its share per sample).
      model.memory_unmeasured = false;
      absl::StrAppend(&model.memory_source,
                      absl::StrFormat("; then it ran out of memory at micro-batch %d needing at least %s, all of "
                                      "it taken to grow with the batch",
                                      b, FormatBytes(MemoryNeededAt(oom))));
    }
    // Held against the estimate of the strategy the rank ran: with sharded optimizer states it
    // needed less than a rank keeping them all.
    const int shards = std::max(1, oom.optimizer_state_shards());
    const fitrun::v1::MemoryBreakdown predicted = EstimateRankMemory(model, spec, b, estimator, {}, shards);
    const int64_t predicted_before_margin = predicted.total_bytes() - predicted.safety_margin_bytes();
    const int64_t shortfall = MemoryNeededAt(oom) - predicted_before_margin;
    if (shortfall <= 0) continue;
    if (model.measured.has_value()) {
      // As for the analytic profile: what the batch adds is taken to be what was underestimated,
      // so smaller batches are judged by the same per-sample cost.
      const MemoryCurve& curve = *model.measured;
      const double added = static_cast<double>(std::max<int64_t>(1, curve.PeakAt(b) - curve.FixedBytes()));
      // The curve is of ranks that keep every state: a sharded rank's need, in its terms, adds the
      // other ranks' shares.
      const int64_t other_shares =
          shards > 1 ? EstimateRankMemory(model, spec, b, estimator).optimizer_state_bytes() - predicted.optimizer_state_bytes()
                     : 0;
      const double needed = static_cast<double>(MemoryNeededAt(oom) + other_shares - curve.FixedBytes());
      model.measured = curve.ScaledPerSample(needed / added);
      absl::StrAppend(&model.memory_source,
                      absl::StrFormat("; its per-sample part scaled by %.2f after an out-of-memory error at "
                                      "micro-batch %d",
                                      needed / added, b));
      continue;
    }
    model.activation_bytes_per_sample += (shortfall + b - 1) / b;
  }
  return model;
}

}  // namespace fitrun::server
