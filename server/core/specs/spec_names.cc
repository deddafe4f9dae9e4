#include "server/core/specs/spec_names.h"

#include "server/core/specs/job_specs.h"

namespace fitrun::server {

const std::vector<std::pair<std::string, fitrun::v1::LossKind>>& LossNames() {
  static const auto* names = new std::vector<std::pair<std::string, fitrun::v1::LossKind>>{
      {"cross_entropy", fitrun::v1::LOSS_KIND_CROSS_ENTROPY},
      {"mse", fitrun::v1::LOSS_KIND_MSE},
      {"l1", fitrun::v1::LOSS_KIND_L1},
      {"bce_with_logits", fitrun::v1::LOSS_KIND_BCE_WITH_LOGITS},
      {"smooth_l1", fitrun::v1::LOSS_KIND_SMOOTH_L1},
      {"module", fitrun::v1::LOSS_KIND_MODULE},
  };
  return *names;
}

const std::vector<std::pair<std::string, fitrun::v1::OptimizerKind>>& OptimizerNames() {
  static const auto* names = new std::vector<std::pair<std::string, fitrun::v1::OptimizerKind>>{
      {"sgd", fitrun::v1::OPTIMIZER_KIND_SGD},
      {"adam", fitrun::v1::OPTIMIZER_KIND_ADAM},
      {"adamw", fitrun::v1::OPTIMIZER_KIND_ADAMW},
  };
  return *names;
}

const std::vector<std::pair<std::string, fitrun::v1::CommHook>>& CommHookNames() {
  static const auto* names = new std::vector<std::pair<std::string, fitrun::v1::CommHook>>{
      {"none", fitrun::v1::COMM_HOOK_NONE},
      {"fp16", fitrun::v1::COMM_HOOK_FP16},
      {"bf16", fitrun::v1::COMM_HOOK_BF16},
      {"powersgd", fitrun::v1::COMM_HOOK_POWERSGD},
  };
  return *names;
}

std::string CommHookNameOf(fitrun::v1::CommHook hook) {
  for (const auto& [name, value] : CommHookNames()) {
    if (value == hook) return name;
  }
  return "none";
}

const std::vector<std::pair<std::string, fitrun::v1::Precision>>& PrecisionNames() {
  static const auto* names = new std::vector<std::pair<std::string, fitrun::v1::Precision>>{
      {"fp32", fitrun::v1::PRECISION_FP32},
      {"bf16", fitrun::v1::PRECISION_BF16},
      {"fp16", fitrun::v1::PRECISION_FP16},
  };
  return *names;
}

absl::string_view OptimizerKindName(fitrun::v1::OptimizerKind kind) {
  for (const auto& [name, value] : OptimizerNames()) {
    if (value == kind) return name;
  }
  return "unspecified";
}

absl::string_view PrecisionName(fitrun::v1::Precision precision) {
  for (const auto& [name, value] : PrecisionNames()) {
    if (value == precision) return name;
  }
  return "fp32";
}

absl::string_view JobStateName(fitrun::v1::JobState state) {
  switch (state) {
    case fitrun::v1::JOB_STATE_QUEUED: return "QUEUED";
    case fitrun::v1::JOB_STATE_PLANNING: return "PLANNING";
    case fitrun::v1::JOB_STATE_RUNNING: return "RUNNING";
    case fitrun::v1::JOB_STATE_RESTARTING: return "RESTARTING";
    case fitrun::v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case fitrun::v1::JOB_STATE_FAILED: return "FAILED";
    case fitrun::v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNSPECIFIED";
  }
}

}  // namespace fitrun::server
