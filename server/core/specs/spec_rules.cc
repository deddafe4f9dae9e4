// Job specs as the coordinator accepts them: ranges and cross-field rules checked (each error names the
// field and what would do), client paths resolved, defaults filled in.
#include "server/core/specs/job_specs.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/data_contract.h"
#include "proto/contract/find_command.h"
#include "proto/contract/launch_contract.h"
#include "server/core/errors.h"
#include "server/core/specs/spec_names.h"
#include "server/core/specs/spec_files.h"
#include "server/core/specs/workloads.h"
#include "server/core/units.h"

namespace fitrun::server {
namespace launch = fitrun::contract::launch;
namespace {

using fitrun::v1::JobSpec;

// spec.ddp's communication hook and PowerSGD's knobs (PyTorch's PowerSGDState).
absl::Status ValidateDdp(const JobSpec& spec) {
  const fitrun::v1::DdpSpec& ddp = spec.ddp();
  if (!fitrun::v1::CommHook_IsValid(ddp.comm_hook())) {
    return FieldError("spec.ddp.comm_hook", absl::StrCat("unknown value ", static_cast<int>(ddp.comm_hook()),
                                                         "; use one of: none, fp16, bf16, powersgd"));
  }
  const bool hooked = ddp.comm_hook() != fitrun::v1::COMM_HOOK_UNSPECIFIED &&
                      ddp.comm_hook() != fitrun::v1::COMM_HOOK_NONE;
  if (hooked && spec.has_script()) {
    return FieldError("spec.ddp.comm_hook",
                      absl::StrCat("applies to fitrun's built-in training (got ", CommHookNameOf(ddp.comm_hook()),
                                   " on a script job); a script registers its own with ddp.register_comm_hook"));
  }
  const bool powersgd = ddp.comm_hook() == fitrun::v1::COMM_HOOK_POWERSGD;
  if (!powersgd && (ddp.has_powersgd_rank() || ddp.has_powersgd_start_iter())) {
    return FieldError(ddp.has_powersgd_rank() ? "spec.ddp.powersgd_rank" : "spec.ddp.powersgd_start_iter",
                      absl::StrCat("only used with comm_hook: powersgd (got comm_hook: ",
                                   CommHookNameOf(ddp.comm_hook()), "); set comm_hook: powersgd or remove it"));
  }
  if (ddp.has_powersgd_rank() && ddp.powersgd_rank() < 1) {
    return FieldError("spec.ddp.powersgd_rank",
                      absl::StrCat("must be >= 1 (got ", ddp.powersgd_rank(), "); 1 to 4 is typical"));
  }
  if (ddp.has_zero_stage() && ddp.zero_stage() != 0 && ddp.zero_stage() != 1) {
    return FieldError("spec.ddp.zero_stage",
                      absl::StrCat("must be 0 (every rank keeps all optimizer states) or 1 (each rank keeps its share: "
                                   "ZeRO stage 1), got ", ddp.zero_stage(), "; leave it out to let the planner choose"));
  }
  if (ddp.has_zero_stage() && ddp.zero_stage() == 1 && spec.has_script() && !spec.script().applies_strategy()) {
    return FieldError("spec.ddp.zero_stage",
                      "a script shards its optimizer states itself: set spec.script.applies_strategy: true and "
                      "call run.apply_strategy(model, optimizer) (fitrun's Python module), which takes "
                      "FITRUN_ZERO_STAGE=1 to torch's ZeroRedundancyOptimizer, or leave zero_stage out");
  }
  if (ddp.has_powersgd_start_iter() && ddp.powersgd_start_iter() < 2) {
    return FieldError("spec.ddp.powersgd_start_iter",
                      absl::StrCat("must be >= 2 (got ", ddp.powersgd_start_iter(),
                                   "): error feedback and warm start begin after plain all-reduce steps, as "
                                   "PyTorch's PowerSGDState requires start_powerSGD_iter > 1"));
  }
  return absl::OkStatus();
}

// A script job: its command must run on this machine as the ranks will run it.
absl::Status ValidateScript(const JobSpec& spec, fitrun::v1::SpecFileFacts* facts) {
  if (spec.has_model() || spec.has_data()) {
    return FieldError("spec.script", "a job runs either a script or a model on data; remove spec.model and spec.data");
  }
  const fitrun::v1::ScriptSpec& script = spec.script();
  if (script.command().empty()) {
    return FieldError("spec.script.command", "required; an argv such as [/usr/bin/python3, train.py]");
  }
  const std::string& dir = script.working_dir();
  if (dir.empty() || dir[0] != '/') {
    return FieldError("spec.script.working_dir",
                      absl::StrCat("must be an absolute path (got '", dir,
                                   "'); the fitrun CLI and Python client resolve a relative one against their "
                                   "own directory"));
  }
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    return FieldError("spec.script.working_dir", absl::StrCat("no directory '", dir, "' on the coordinator's machine"));
  }
  if (absl::StatusOr<std::string> found = launch::FindCommand(script.command(0), dir); !found.ok()) {
    return FieldError("spec.script.command[0]", found.status().message());
  }
  if (std::optional<int> index = ScriptFileIndex(script); index.has_value()) {
    const std::string file = (std::filesystem::path(dir) / script.command(*index)).string();
    absl::StatusOr<SpecFile> opened = SpecFile::Open(file);
    if (!opened.ok()) {
      return FieldError(absl::StrCat("spec.script.command[", *index, "]"),
                        absl::IsNotFound(opened.status())
                            ? absl::StrCat("no file '", script.command(*index), "' in spec.script.working_dir '", dir,
                                           "'")
                            : std::string(opened.status().message()));
    }
    // A rewritten script is another workload to measure (part of its calibration key).
    (*facts->mutable_versions())[file] = opened->version();
  }
  if (!script.batch_flag().empty() && script.batch_flag()[0] != '-') {
    return FieldError("spec.script.batch_flag",
                      absl::StrCat("a flag such as --batch_size (got '", script.batch_flag(), "')"));
  }
  if (!script.grad_accum_flag().empty() && script.grad_accum_flag()[0] != '-') {
    return FieldError("spec.script.grad_accum_flag",
                      absl::StrCat("a flag such as --grad_accum_steps (got '", script.grad_accum_flag(), "')"));
  }
  if (script.has_activation_checkpointing() && !script.applies_strategy()) {
    return FieldError("spec.script.activation_checkpointing",
                      "only a script that applies the plan's strategy can recompute its activations: set "
                      "spec.script.applies_strategy: true and call run.apply_strategy(model, optimizer) "
                      "(fitrun's Python module), or remove activation_checkpointing");
  }
  for (const auto& [key, value] : script.env()) {
    const std::string field = absl::StrCat("spec.script.env.", key);
    if (key.empty() || key.find('=') != std::string::npos) return FieldError(field, "not a variable name");
    const std::vector<std::string> torchrun = {launch::kRank,          launch::kLocalRank,     launch::kWorldSize,
                                               launch::kLocalWorldSize, launch::kMasterAddr,    launch::kMasterPort,
                                               launch::kUseAgentStore,  launch::kRestartCount};
    if (absl::StartsWith(key, "FITRUN_") || std::find(torchrun.begin(), torchrun.end(), key) != torchrun.end()) {
      return FieldError(field, "set by fitrun for every rank; remove it from spec.script.env");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int> ScriptFileIndex(const fitrun::v1::ScriptSpec& script) {
  if (script.command().empty()) return std::nullopt;
  const std::string program = std::filesystem::path(script.command(0)).filename().string();
  if (!absl::StartsWith(program, "python")) return std::nullopt;
  for (int i = 1; i < script.command_size(); ++i) {
    const std::string& arg = script.command(i);
    if (arg == "-m" || arg == "-c") return std::nullopt;  // a module or inline code: no file to check
    if (!arg.empty() && arg[0] != '-') return i;
  }
  return std::nullopt;
}

absl::Status ResolveClientPaths(JobSpec& spec, const std::string& client_dir) {
  std::vector<std::pair<std::string, std::string*>> paths;
  if (spec.has_script()) {
    // An empty working_dir is the client's own directory.
    paths.emplace_back("spec.script.working_dir", spec.mutable_script()->mutable_working_dir());
  }
  if (spec.has_model() && spec.model().kind_case() == fitrun::v1::ModelSpec::kTorchscript) {
    paths.emplace_back("spec.model.torchscript", spec.mutable_model()->mutable_torchscript());
  }
  if (spec.has_data()) {
    if (!spec.data().path().empty()) paths.emplace_back("spec.data.path", spec.mutable_data()->mutable_path());
    if (!spec.data().test_path().empty()) {
      paths.emplace_back("spec.data.test_path", spec.mutable_data()->mutable_test_path());
    }
  }
  for (const auto& [field, path] : paths) {
    if (!path->empty() && (*path)[0] == '/') continue;
    if (client_dir.empty() || client_dir[0] != '/') {
      return FieldError(field, absl::StrCat("'", *path, "' is relative and the request gave no client_dir to resolve "
                                                        "it against; give an absolute path"));
    }
    *path = (std::filesystem::path(client_dir) / *path).lexically_normal().string();
    if (path->size() > 1 && path->back() == '/') path->pop_back();
  }
  return absl::OkStatus();
}

namespace {

// ValidateJobSpec's steps, in the order it checks: each returns the first field it finds wrong.

absl::Status ValidateName(const JobSpec& spec) {
  const std::string& name = spec.name();
  if (name.empty()) return FieldError("spec.name", "required; give the job a short name such as fashion-mnist-mlp");
  if (name.size() > 63) return FieldError("spec.name", absl::StrCat("at most 63 characters (got ", name.size(), ")"));
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return FieldError("spec.name", absl::StrCat("use letters, digits, '-', '_' or '.' only (got '", name, "')"));
    }
  }
  return absl::OkStatus();
}

// How long to train: the global batch, epochs, max_steps.
absl::Status ValidateLength(const JobSpec& spec) {
  if (spec.global_batch_size() <= 0) {
    return FieldError("spec.global_batch_size",
                      absl::StrCat("must be a positive number of samples per step (got ", spec.global_batch_size(), ")"));
  }
  if (spec.epochs() < 0) return FieldError("spec.epochs", absl::StrCat("must be >= 0 (got ", spec.epochs(), ")"));
  if (spec.max_steps() < 0) {
    return FieldError("spec.max_steps", absl::StrCat("must be >= 0 (got ", spec.max_steps(), ")"));
  }
  if (spec.epochs() == 0 && spec.max_steps() == 0 && !spec.has_script()) {
    return FieldError("spec.epochs", "set epochs or max_steps to say how long to train");
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const JobSpec& spec) {
  const auto& optimizer = spec.optimizer();
  // A script brings its own optimizer; fitrun only scales the lr it is given (FITRUN_LR).
  const bool script = spec.has_script();
  if (optimizer.kind() == fitrun::v1::OPTIMIZER_KIND_UNSPECIFIED && !script) {
    return FieldError("spec.optimizer.kind", "required; use one of: sgd, adam, adamw");
  }
  if (!(optimizer.lr() > 0) && !(script && optimizer.lr() == 0)) {
    return FieldError("spec.optimizer.lr", absl::StrCat("must be > 0 (got ", optimizer.lr(), ")"));
  }
  if (optimizer.momentum() < 0 || optimizer.momentum() >= 1) {
    return FieldError("spec.optimizer.momentum", absl::StrCat("must be in [0, 1) (got ", optimizer.momentum(), ")"));
  }
  if (optimizer.momentum() != 0 && optimizer.kind() != fitrun::v1::OPTIMIZER_KIND_SGD) {
    return FieldError("spec.optimizer.momentum", "only sgd takes momentum; adam and adamw keep their own moments");
  }
  if (optimizer.weight_decay() < 0) {
    return FieldError("spec.optimizer.weight_decay",
                      absl::StrCat("must be >= 0 (got ", optimizer.weight_decay(), ")"));
  }
  if (optimizer.reference_batch_size() < 0) {
    return FieldError("spec.optimizer.reference_batch_size",
                      absl::StrCat("must be >= 0 (got ", optimizer.reference_batch_size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateResources(const JobSpec& spec) {
  const auto& resources = spec.resources();
  if (resources.min_devices() < 0) {
    return FieldError("spec.resources.min_devices", absl::StrCat("must be >= 1 (got ", resources.min_devices(), ")"));
  }
  if (resources.max_devices() < 0) {
    return FieldError("spec.resources.max_devices", absl::StrCat("must be >= 1 (got ", resources.max_devices(), ")"));
  }
  const int min_devices = std::max(1, resources.min_devices());
  if (resources.max_devices() != 0 && resources.max_devices() < min_devices) {
    return FieldError("spec.resources.max_devices", absl::StrCat("must be >= min_devices (got ", resources.max_devices(),
                                                                 " < ", min_devices, ")"));
  }
  if (resources.per_device_batch() < 0) {
    return FieldError("spec.resources.per_device_batch",
                      absl::StrCat("must be >= 1, or leave it out to let the planner choose (got ",
                                   resources.per_device_batch(), ")"));
  }
  if (resources.per_device_batch() > spec.global_batch_size()) {
    return FieldError("spec.resources.per_device_batch",
                      absl::StrCat("must be <= global_batch_size (got ", resources.per_device_batch(), " > ",
                                   spec.global_batch_size(), ")"));
  }
  if (resources.memory_headroom() < 0 || resources.memory_headroom() > 0.9) {
    return FieldError("spec.resources.memory_headroom",
                      absl::StrCat("must be in [0, 0.9] (got ", resources.memory_headroom(), ")"));
  }
  if (resources.min_nodes() < 0) {
    return FieldError("spec.resources.min_nodes", absl::StrCat("must be >= 1 (got ", resources.min_nodes(), ")"));
  }
  if (resources.max_nodes() < 0) {
    return FieldError("spec.resources.max_nodes", absl::StrCat("must be >= 1 (got ", resources.max_nodes(), ")"));
  }
  if (resources.max_nodes() != 0 && resources.max_nodes() < std::max(1, resources.min_nodes())) {
    return FieldError("spec.resources.max_nodes", absl::StrCat("must be >= min_nodes (got ", resources.max_nodes(),
                                                               " < ", std::max(1, resources.min_nodes()), ")"));
  }
  if (resources.max_devices() != 0 && resources.min_nodes() > resources.max_devices()) {
    return FieldError("spec.resources.min_nodes",
                      absl::StrCat("needs at least one device per node, so at most max_devices (got ",
                                   resources.min_nodes(), " > ", resources.max_devices(), ")"));
  }
  if (resources.time_limit_minutes() < 0) {
    return FieldError("spec.resources.time_limit_minutes",
                      absl::StrCat("must be >= 1, or leave it out for no limit (got ", resources.time_limit_minutes(),
                                   ")"));
  }
  if (!resources.host_memory().empty()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(resources.host_memory());
    if (!bytes.ok()) return FieldError("spec.resources.host_memory", bytes.status().message());
    if (*bytes < kMinHostMemoryPerRank) {
      return FieldError("spec.resources.host_memory",
                        absl::StrCat("must be at least ", FormatBytes(kMinHostMemoryPerRank),
                                     " per rank, which a rank's process alone needs (got ", resources.host_memory(),
                                     ")"));
    }
  }
  if (resources.max_processes() < 0 || (resources.max_processes() > 0 && resources.max_processes() < kMinProcessesPerRank)) {
    return FieldError("spec.resources.max_processes",
                      absl::StrCat("must be at least ", kMinProcessesPerRank,
                                   " (a rank's own threads count), or leave it out for 512 (got ",
                                   resources.max_processes(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpointAndDdp(const JobSpec& spec) {
  if (spec.checkpoint().every_steps() < 0) {
    return FieldError("spec.checkpoint.every_steps", absl::StrCat("must be >= 0 (got ", spec.checkpoint().every_steps(), ")"));
  }
  if (spec.checkpoint().keep_last() < 0) {
    return FieldError("spec.checkpoint.keep_last", absl::StrCat("must be >= 1, or leave it out for the default of 2 (got ",
                                                                     spec.checkpoint().keep_last(), ")"));
  }
  if (spec.ddp().bucket_cap_mb() < 0) {
    return FieldError("spec.ddp.bucket_cap_mb", absl::StrCat("must be > 0 (got ", spec.ddp().bucket_cap_mb(), ")"));
  }
  if (spec.ddp().collective_timeout_seconds() < 0) {
    return FieldError("spec.ddp.collective_timeout_seconds",
                      absl::StrCat("must be > 0 (got ", spec.ddp().collective_timeout_seconds(), ")"));
  }
  return ValidateDdp(spec);
}

// Fault tolerance, and fault injection (the tests' and the benchmarks' faults).
absl::Status ValidateFaults(const JobSpec& spec) {
  const auto& tolerance = spec.fault_tolerance();
  if (tolerance.max_restarts() < 0) {
    return FieldError("spec.fault_tolerance.max_restarts", absl::StrCat("must be >= 0 (got ", tolerance.max_restarts(), ")"));
  }
  if (tolerance.max_oom_retries() < 0) {
    return FieldError("spec.fault_tolerance.max_oom_retries",
                      absl::StrCat("must be >= 0 (got ", tolerance.max_oom_retries(), ")"));
  }
  if (tolerance.heartbeat_timeout_seconds() < 0) {
    return FieldError("spec.fault_tolerance.heartbeat_timeout_seconds",
                      absl::StrCat("must be > 0 (got ", tolerance.heartbeat_timeout_seconds(), ")"));
  }
  if (tolerance.stop_grace_seconds() < 0 || tolerance.stop_grace_seconds() > 600) {
    return FieldError("spec.fault_tolerance.stop_grace_seconds",
                      absl::StrCat("must be in [0, 600] (got ", tolerance.stop_grace_seconds(), ")"));
  }

  const auto& fault = spec.fault_injection();
  if (fault.kind() != fitrun::v1::FaultInjection::KIND_UNSPECIFIED) {
    if (fault.rank() < 0) return FieldError("spec.fault_injection.rank", "must be >= 0");
    if (fault.at_step() < 1) return FieldError("spec.fault_injection.at_step", "must be >= 1");
    if (fault.attempt() < 0) return FieldError("spec.fault_injection.attempt", "must be >= 1 (or 0 for the first)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec, fitrun::v1::SpecFileFacts* facts) {
  fitrun::v1::SpecFileFacts ignored;
  if (facts == nullptr) facts = &ignored;
  if (absl::Status s = ValidateName(spec); !s.ok()) return s;
  if (absl::Status s = spec.has_script() ? ValidateScript(spec, facts) : ValidateModelAndData(spec, facts); !s.ok()) {
    return s;
  }
  // fp16 needs CUDA devices (autocast with a gradient scaler): the planner, which knows the devices,
  // refuses it on CPU ones.
  for (absl::Status (*step)(const JobSpec&) :
       {ValidateLength, ValidateOptimizer, ValidateResources, ValidateCheckpointAndDdp, ValidateFaults}) {
    if (absl::Status s = step(spec); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void ApplyJobSpecDefaults(JobSpec& spec) {
  auto* optimizer = spec.mutable_optimizer();
  if (optimizer->lr_scaling() == fitrun::v1::LR_SCALING_UNSPECIFIED) {
    optimizer->set_lr_scaling(fitrun::v1::LR_SCALING_NONE);
  }
  if (optimizer->reference_batch_size() == 0) optimizer->set_reference_batch_size(spec.global_batch_size());
  if (spec.precision() == fitrun::v1::PRECISION_UNSPECIFIED) spec.set_precision(fitrun::v1::PRECISION_FP32);
  auto* resources = spec.mutable_resources();
  if (resources->min_devices() == 0) resources->set_min_devices(spec_defaults::kMinDevices);
  if (resources->memory_headroom() == 0) resources->set_memory_headroom(spec_defaults::kMemoryHeadroom);
  if (resources->max_processes() == 0) resources->set_max_processes(spec_defaults::kMaxProcessesPerRank);
  if (spec.checkpoint().keep_last() == 0) spec.mutable_checkpoint()->set_keep_last(spec_defaults::kKeepLastCheckpoints);
  auto* ddp = spec.mutable_ddp();
  if (ddp->bucket_cap_mb() == 0) ddp->set_bucket_cap_mb(spec_defaults::kBucketCapMb);
  if (ddp->collective_timeout_seconds() == 0) {
    ddp->set_collective_timeout_seconds(spec_defaults::kCollectiveTimeoutSeconds);
  }
  if (ddp->comm_hook() == fitrun::v1::COMM_HOOK_UNSPECIFIED) ddp->set_comm_hook(fitrun::v1::COMM_HOOK_NONE);
  if (ddp->comm_hook() == fitrun::v1::COMM_HOOK_POWERSGD) {
    if (!ddp->has_powersgd_rank()) ddp->set_powersgd_rank(spec_defaults::kPowerSgdRank);
    if (!ddp->has_powersgd_start_iter()) ddp->set_powersgd_start_iter(spec_defaults::kPowerSgdStartIter);
  }
  auto* tolerance = spec.mutable_fault_tolerance();
  if (!tolerance->has_max_restarts()) tolerance->set_max_restarts(spec_defaults::kMaxRestarts);
  if (!tolerance->has_max_oom_retries()) tolerance->set_max_oom_retries(spec_defaults::kMaxOomRetries);
  if (tolerance->heartbeat_timeout_seconds() == 0) {
    tolerance->set_heartbeat_timeout_seconds(spec_defaults::kHeartbeatTimeoutSeconds);
  }
  if (tolerance->stop_grace_seconds() == 0) tolerance->set_stop_grace_seconds(spec_defaults::kStopGraceSeconds);
  if (spec.data().kind() == fitrun::v1::DATA_KIND_TENSORS) {
    auto* data = spec.mutable_data();
    if (data->target().empty()) data->set_target(fitrun::contract::data::kDefaultTargetKey);
    if (!data->has_test_fraction() && data->test_path().empty()) {
      data->set_test_fraction(fitrun::contract::data::kDefaultTestFraction);
    }
  }
  if (spec.model().kind_case() == fitrun::v1::ModelSpec::kTorchscript &&
      spec.loss().kind() == fitrun::v1::LOSS_KIND_UNSPECIFIED) {
    spec.mutable_loss()->set_kind(fitrun::v1::LOSS_KIND_CROSS_ENTROPY);
  }
}

absl::StatusOr<JobSpec> NormalizeJobSpec(JobSpec spec) {
  // What fitrund read of the files is its own record, never the submitter's word.
  spec.clear_file_facts();
  fitrun::v1::SpecFileFacts facts;
  if (absl::Status status = ValidateJobSpec(spec, &facts); !status.ok()) return status;
  ApplyJobSpecDefaults(spec);
  *spec.mutable_file_facts() = std::move(facts);
  return spec;
}

}  // namespace fitrun::server
