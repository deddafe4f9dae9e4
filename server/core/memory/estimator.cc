#include "server/core/memory/estimator.h"

#include <algorithm>
#include <cmath>

namespace fitrun::server {
namespace {

// Buffers an optimizer keeps per parameter: SGD none unless it has momentum (one); Adam and AdamW two
// moments.
int64_t OptimizerStatesPerParameter(const fitrun::v1::JobSpec& spec) {
  switch (spec.optimizer().kind()) {
    case fitrun::v1::OPTIMIZER_KIND_SGD:
      return spec.optimizer().momentum() > 0 ? 1 : 0;
    case fitrun::v1::OPTIMIZER_KIND_ADAM:
    case fitrun::v1::OPTIMIZER_KIND_ADAMW:
      return 2;
    default:
      return 0;
  }
}

// The all-reduce's flat bucket buffers hold one copy of every gradient whatever the bucket cap,
// and the gradients are views into them (worker/ddp/bucketed_reducer.h, as PyTorch's
// gradient_as_bucket_view): counted once, as gradients, plus the loss slot. A communication hook
// keeps more beside them (worker/ddp/comm_hook.h), per gradient element at its peak: fp16 and
// bf16 a 2-byte copy of every bucket and, on Gloo, the all-gathered copies of up to 3 ranks (6),
// then one bucket's float32 sum (at most 4); PowerSGD its error feedback and the copy of its input
// (4 + 4), and the uncompressed gradients' all-reduce buffer (at most 4).
int64_t HookBytesPerGradientElement(const fitrun::v1::JobSpec& spec) {
  switch (spec.ddp().comm_hook()) {
    case fitrun::v1::COMM_HOOK_FP16:
    case fitrun::v1::COMM_HOOK_BF16:
      return 2 + 6 + 4;
    case fitrun::v1::COMM_HOOK_POWERSGD:
      return 4 + 4 + 4;
    default:
      return 0;
  }
}

// A GPU: the caching allocator holds its reserve on top of what it hands out (`m`'s total so far), and
// the process holds the context, the libraries' workspaces and the collectives' buffers outside it.
void AddDeviceCosts(const DeviceCosts& costs, fitrun::v1::MemoryBreakdown& m) {
  const int64_t handed_out = m.total_bytes();
  m.set_allocator_reserve_bytes(std::max(
      costs.reserve_floor_bytes,
      static_cast<int64_t>(std::ceil(static_cast<double>(handed_out) * std::max(0.0, costs.reserve_ratio - 1.0)))));
  m.set_allocator_bytes(handed_out + m.allocator_reserve_bytes());
  m.set_cuda_context_bytes(costs.context_bytes);
  m.set_library_workspace_bytes(costs.library_workspace_bytes);
  m.set_communication_bytes(costs.communication_bytes);
  m.set_total_bytes(m.allocator_bytes() + costs.outside_allocator_bytes());
}

}  // namespace

fitrun::v1::MemoryBreakdown EstimateRankMemory(const ModelProfile& model, const fitrun::v1::JobSpec& spec,
                                               int64_t per_device_batch, const EstimatorOptions& options,
                                               const DeviceCosts& costs, int optimizer_state_shards) {
  constexpr int64_t kFloat = 4;
  const int64_t param_bytes = model.parameter_count * kFloat;

  fitrun::v1::MemoryBreakdown m;
  m.set_weights_bytes(param_bytes);
  m.set_gradients_bytes(param_bytes);
  m.set_optimizer_state_bytes(OptimizerStatesPerParameter(spec) * param_bytes);
  // The flat buckets hold the gradients themselves (counted above): the loss slot, and what a hook keeps.
  m.set_ddp_buckets_bytes(kFloat + HookBytesPerGradientElement(spec) * model.parameter_count);

  double margin = options.safety_margin;
  if (model.measured.has_value()) {
    // The measured peak holds the model states counted above; what it holds beyond them and the
    // activations is the runtime's (autograd bookkeeping, kernels' scratch, the optimizer step's
    // temporaries). When the arithmetic counts more than was measured (a state the probe's peak did
    // not overlap), the arithmetic stands: the estimate errs high.
    const int64_t states =
        m.weights_bytes() + m.gradients_bytes() + m.optimizer_state_bytes() + m.ddp_buckets_bytes();
    const int64_t peak = model.measured->PeakAt(per_device_batch);
    m.set_activations_bytes(std::max<int64_t>(0, peak - model.measured->FixedBytes()));
    m.set_workspace_bytes(0);
    m.set_framework_overhead_bytes(std::max<int64_t>(0, peak - m.activations_bytes() - states));
    margin = options.calibrated_safety_margin;
  } else {
    m.set_activations_bytes(per_device_batch * (model.activation_bytes_per_sample + model.input_bytes_per_sample));
    m.set_workspace_bytes(options.workspace_bytes);
    m.set_framework_overhead_bytes(options.framework_overhead_bytes);
  }
  if (optimizer_state_shards > 1) {
    // A rank keeps its share: the rest leaves the states line (and, for a measured profile, the
    // measured peak that held all of them). The partition is by whole parameters, largest first
    // (worker/ddp/optimizer_state_sharding.h), so a model of many similar layers splits within one
    // small layer of even.
    m.set_optimizer_state_bytes((m.optimizer_state_bytes() + optimizer_state_shards - 1) / optimizer_state_shards);
  }

  const int64_t subtotal = m.weights_bytes() + m.gradients_bytes() + m.optimizer_state_bytes() +
                           m.ddp_buckets_bytes() + m.activations_bytes() + m.workspace_bytes() +
                           m.framework_overhead_bytes();
  m.set_safety_margin_bytes(static_cast<int64_t>(std::ceil(subtotal * margin)));
  m.set_total_bytes(subtotal + m.safety_margin_bytes());
  if (costs.any()) AddDeviceCosts(costs, m);
  return m;
}

int64_t ChargedBytes(const fitrun::v1::MemoryBreakdown& predicted, const DeviceCosts& costs) {
  if (predicted.allocator_bytes() <= 0) return predicted.total_bytes();
  const int64_t handed_out = predicted.allocator_bytes() - predicted.allocator_reserve_bytes();
  const int64_t needed = static_cast<int64_t>(std::ceil(static_cast<double>(handed_out) * costs.needed_ratio));
  return needed + (costs.capacity_binds_allocator_only ? 0 : costs.outside_allocator_bytes());
}

void FitReserveToLimit(fitrun::v1::MemoryBreakdown& predicted, int64_t allocator_limit) {
  if (predicted.allocator_bytes() <= 0) return;
  const int64_t handed_out = predicted.allocator_bytes() - predicted.allocator_reserve_bytes();
  const int64_t outside = predicted.total_bytes() - predicted.allocator_bytes();
  const int64_t reserve = std::clamp<int64_t>(allocator_limit - handed_out, 0, predicted.allocator_reserve_bytes());
  predicted.set_allocator_reserve_bytes(reserve);
  predicted.set_allocator_bytes(handed_out + reserve);
  predicted.set_total_bytes(predicted.allocator_bytes() + outside);
}

}  // namespace fitrun::server
