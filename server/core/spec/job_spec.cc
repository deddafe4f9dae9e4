#include "server/core/spec/job_spec.h"

#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/contract/data_contract.h"
#include "proto/contract/find_command.h"
#include "proto/contract/launch_contract.h"
#include "server/core/errors.h"
#include "server/core/spec/workloads.h"

namespace fitrun::server {
namespace launch = fitrun::contract::launch;
namespace {

using fitrun::v1::JobSpec;

std::string Where(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0) return "";
  return absl::StrCat(" (line ", mark.line + 1, ")");
}

// ---- scalars -----------------------------------------------------------------------------------

absl::StatusOr<std::string> ReadString(const YAML::Node& node, const std::string& path) {
  if (!node.IsScalar()) return FieldError(path, absl::StrCat("expected a string", Where(node)));
  return node.Scalar();
}

absl::StatusOr<int64_t> ReadInt(const YAML::Node& node, const std::string& path) {
  if (!node.IsScalar()) return FieldError(path, absl::StrCat("expected an integer", Where(node)));
  const std::string& text = node.Scalar();
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    return FieldError(path, absl::StrCat("expected an integer, got '", text, "'", Where(node)));
  }
  return value;
}

absl::StatusOr<double> ReadDouble(const YAML::Node& node, const std::string& path) {
  if (!node.IsScalar()) return FieldError(path, absl::StrCat("expected a number", Where(node)));
  const std::string& text = node.Scalar();
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) {
    return FieldError(path, absl::StrCat("expected a number, got '", text, "'", Where(node)));
  }
  return value;
}

template <typename Enum>
absl::StatusOr<Enum> ReadEnum(const YAML::Node& node, const std::string& path,
                              const std::vector<std::pair<std::string, Enum>>& names) {
  absl::StatusOr<std::string> text = ReadString(node, path);
  if (!text.ok()) return text.status();
  std::vector<std::string> known;
  for (const auto& [name, value] : names) {
    if (name == *text) return value;
    known.push_back(name);
  }
  return FieldError(path, absl::StrCat("unknown value '", *text, "'", Where(node), "; use one of: ",
                                       absl::StrJoin(known, ", ")));
}

// ---- mappings ----------------------------------------------------------------------------------

// One field of a YAML mapping: how to read it into the spec.
using FieldReader = std::function<absl::Status(const YAML::Node& value, const std::string& path)>;

// Reads every key of `node` with its reader; a key without one is an unknown field.
absl::Status ReadMapping(const YAML::Node& node, const std::string& path,
                         const std::vector<std::pair<std::string, FieldReader>>& fields) {
  if (!node.IsMap()) {
    return FieldError(path, absl::StrCat("expected a mapping of fields", Where(node)));
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.Scalar();
    const std::string field_path = absl::StrCat(path, ".", key);
    const FieldReader* reader = nullptr;
    std::vector<std::string> known;
    for (const auto& [name, field_reader] : fields) {
      if (name == key) reader = &field_reader;
      known.push_back(name);
    }
    if (reader == nullptr) {
      return FieldError(field_path, absl::StrCat("unknown field", Where(entry.first),
                                                 "; known fields: ", absl::StrJoin(known, ", ")));
    }
    if (absl::Status status = (*reader)(entry.second, field_path); !status.ok()) return status;
  }
  return absl::OkStatus();
}

// Readers that store into a proto field through a setter.
template <typename Setter>
FieldReader Int(Setter set) {
  return [set](const YAML::Node& node, const std::string& path) -> absl::Status {
    absl::StatusOr<int64_t> value = ReadInt(node, path);
    if (!value.ok()) return value.status();
    set(*value);
    return absl::OkStatus();
  };
}

template <typename Setter>
FieldReader Double(Setter set) {
  return [set](const YAML::Node& node, const std::string& path) -> absl::Status {
    absl::StatusOr<double> value = ReadDouble(node, path);
    if (!value.ok()) return value.status();
    set(*value);
    return absl::OkStatus();
  };
}

template <typename Setter>
FieldReader String(Setter set) {
  return [set](const YAML::Node& node, const std::string& path) -> absl::Status {
    absl::StatusOr<std::string> value = ReadString(node, path);
    if (!value.ok()) return value.status();
    set(*value);
    return absl::OkStatus();
  };
}

template <typename Setter>
FieldReader Bool(Setter set) {
  return [set](const YAML::Node& node, const std::string& path) -> absl::Status {
    if (node.IsScalar() && (node.Scalar() == "true" || node.Scalar() == "false")) {
      set(node.Scalar() == "true");
      return absl::OkStatus();
    }
    return FieldError(path, absl::StrCat("expected true or false", Where(node)));
  };
}

template <typename Enum, typename Setter>
FieldReader EnumField(std::vector<std::pair<std::string, Enum>> names, Setter set) {
  return [names, set](const YAML::Node& node, const std::string& path) -> absl::Status {
    absl::StatusOr<Enum> value = ReadEnum(node, path, names);
    if (!value.ok()) return value.status();
    set(*value);
    return absl::OkStatus();
  };
}

template <typename Adder>
FieldReader StringList(Adder add) {
  return [add](const YAML::Node& node, const std::string& path) -> absl::Status {
    if (!node.IsSequence()) return FieldError(path, absl::StrCat("expected a list such as [a, b]", Where(node)));
    for (size_t i = 0; i < node.size(); ++i) {
      absl::StatusOr<std::string> value = ReadString(node[i], absl::StrCat(path, "[", i, "]"));
      if (!value.ok()) return value.status();
      add(*value);
    }
    return absl::OkStatus();
  };
}

template <typename Setter>
FieldReader StringMap(Setter set) {
  return [set](const YAML::Node& node, const std::string& path) -> absl::Status {
    if (!node.IsMap()) return FieldError(path, absl::StrCat("expected a mapping such as {KEY: value}", Where(node)));
    for (const auto& entry : node) {
      const std::string key = entry.first.Scalar();
      absl::StatusOr<std::string> value = ReadString(entry.second, absl::StrCat(path, ".", key));
      if (!value.ok()) return value.status();
      set(key, *value);
    }
    return absl::OkStatus();
  };
}

FieldReader Mapping(std::vector<std::pair<std::string, FieldReader>> fields) {
  return [fields](const YAML::Node& node, const std::string& path) {
    return ReadMapping(node, path, fields);
  };
}

// A field written either as a scalar (`loss: mse`) or as a mapping (`loss: {kind: mse}`).
FieldReader ScalarOrMapping(FieldReader scalar, std::vector<std::pair<std::string, FieldReader>> fields) {
  return [scalar, fields](const YAML::Node& node, const std::string& path) {
    return node.IsScalar() ? scalar(node, path) : ReadMapping(node, path, fields);
  };
}

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

// spec.ddp's communication hook and PowerSGD's knobs (PyTorch's PowerSGDState).
absl::Status ValidateCommHook(const JobSpec& spec) {
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
  if (ddp.has_powersgd_start_iter() && ddp.powersgd_start_iter() < 2) {
    return FieldError("spec.ddp.powersgd_start_iter",
                      absl::StrCat("must be >= 2 (got ", ddp.powersgd_start_iter(),
                                   "): error feedback and warm start begin after plain all-reduce steps, as "
                                   "PyTorch's PowerSGDState requires start_powerSGD_iter > 1"));
  }
  return absl::OkStatus();
}

const std::vector<std::pair<std::string, fitrun::v1::Precision>>& PrecisionNames() {
  static const auto* names = new std::vector<std::pair<std::string, fitrun::v1::Precision>>{
      {"fp32", fitrun::v1::PRECISION_FP32},
      {"bf16", fitrun::v1::PRECISION_BF16},
      {"fp16", fitrun::v1::PRECISION_FP16},
  };
  return *names;
}

// A script job: its command must run on this machine as the ranks will run it.
absl::Status ValidateScript(const JobSpec& spec) {
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
    const std::filesystem::path file = std::filesystem::path(dir) / script.command(*index);
    if (!std::filesystem::is_regular_file(file, error)) {
      return FieldError(absl::StrCat("spec.script.command[", *index, "]"),
                        absl::StrCat("no file '", script.command(*index), "' in spec.script.working_dir '", dir,
                                     "'"));
    }
  }
  if (!script.batch_flag().empty() && script.batch_flag()[0] != '-') {
    return FieldError("spec.script.batch_flag",
                      absl::StrCat("a flag such as --batch_size (got '", script.batch_flag(), "')"));
  }
  if (!script.grad_accum_flag().empty() && script.grad_accum_flag()[0] != '-') {
    return FieldError("spec.script.grad_accum_flag",
                      absl::StrCat("a flag such as --grad_accum_steps (got '", script.grad_accum_flag(), "')"));
  }
  for (const auto& [key, value] : script.env()) {
    const std::string field = absl::StrCat("spec.script.env.", key);
    if (key.empty() || key.find('=') != std::string::npos) return FieldError(field, "not a variable name");
    const std::vector<std::string> torchrun = {launch::kRank,          launch::kLocalRank,  launch::kWorldSize,
                                               launch::kLocalWorldSize, launch::kMasterAddr, launch::kMasterPort};
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

absl::StatusOr<JobSpec> ParseJobSpecYaml(absl::string_view yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec: not valid YAML at line ", e.mark.line + 1, ": ", e.msg));
  }
  JobSpec spec;
  if (root.IsNull()) return FieldError("spec", "empty; a job spec needs at least name, model, data");

  auto* model = spec.mutable_model();
  auto* data = spec.mutable_data();
  // A script job has neither; an unset message stays unset in the proto.
  const auto clear_unused = [&] {
    if (model->ByteSizeLong() == 0) spec.clear_model();
    if (data->ByteSizeLong() == 0) spec.clear_data();
  };
  auto* optimizer = spec.mutable_optimizer();
  auto* resources = spec.mutable_resources();
  auto* checkpoint = spec.mutable_checkpoint();
  auto* ddp = spec.mutable_ddp();
  auto* fault = spec.mutable_fault_injection();

  try {
    absl::Status status = ReadMapping(
        root, "spec",
        {
            {"name", String([&](const std::string& v) { spec.set_name(v); })},
            {"model",
             Mapping({
                 {"builtin", String([&](const std::string& v) { model->set_builtin(v); })},
                 {"torchscript", String([&](const std::string& v) { model->set_torchscript(v); })},
                 {"gpt", Mapping({
                             {"layers", Int([&](int64_t v) { model->mutable_gpt()->set_layers(static_cast<int32_t>(v)); })},
                             {"heads", Int([&](int64_t v) { model->mutable_gpt()->set_heads(static_cast<int32_t>(v)); })},
                             {"hidden", Int([&](int64_t v) { model->mutable_gpt()->set_hidden(static_cast<int32_t>(v)); })},
                             {"context", Int([&](int64_t v) { model->mutable_gpt()->set_context(static_cast<int32_t>(v)); })},
                             {"tied_head", Bool([&](bool v) { model->mutable_gpt()->set_tied_head(v); })},
                         })},
                 {"sasrec", Mapping({
                                {"max_len", Int([&](int64_t v) { model->mutable_sasrec()->set_max_len(static_cast<int32_t>(v)); })},
                                {"hidden", Int([&](int64_t v) { model->mutable_sasrec()->set_hidden(static_cast<int32_t>(v)); })},
                                {"blocks", Int([&](int64_t v) { model->mutable_sasrec()->set_blocks(static_cast<int32_t>(v)); })},
                                {"heads", Int([&](int64_t v) { model->mutable_sasrec()->set_heads(static_cast<int32_t>(v)); })},
                            })},
             })},
            {"data", Mapping({
                         {"kind", EnumField<fitrun::v1::DataKind>(
                                      {{"fashion_mnist", fitrun::v1::DATA_KIND_FASHION_MNIST},
                                       {"text", fitrun::v1::DATA_KIND_TEXT},
                                       {"movielens", fitrun::v1::DATA_KIND_MOVIELENS},
                                       {"tensors", fitrun::v1::DATA_KIND_TENSORS}},
                                      [&](fitrun::v1::DataKind v) { data->set_kind(v); })},
                         {"path", String([&](const std::string& v) { data->set_path(v); })},
                         {"target", String([&](const std::string& v) { data->set_target(v); })},
                         {"inputs", StringList([&](const std::string& v) { data->add_inputs(v); })},
                         {"test_fraction", Double([&](double v) { data->set_test_fraction(v); })},
                         {"test_path", String([&](const std::string& v) { data->set_test_path(v); })},
                     })},
            {"loss", ScalarOrMapping(EnumField<fitrun::v1::LossKind>(
                                         LossNames(), [&](fitrun::v1::LossKind v) { spec.mutable_loss()->set_kind(v); }),
                                     {
                                         {"kind", EnumField<fitrun::v1::LossKind>(LossNames(), [&](fitrun::v1::LossKind v) {
                                            spec.mutable_loss()->set_kind(v);
                                          })},
                                         {"ignore_index", Int([&](int64_t v) { spec.mutable_loss()->set_ignore_index(v); })},
                                     })},
            {"script",
             Mapping({
                 {"command", StringList([&](const std::string& v) { spec.mutable_script()->add_command(v); })},
                 {"working_dir", String([&](const std::string& v) { spec.mutable_script()->set_working_dir(v); })},
                 {"env", StringMap([&](const std::string& k, const std::string& v) {
                    (*spec.mutable_script()->mutable_env())[k] = v;
                  })},
                 {"batch_flag", String([&](const std::string& v) { spec.mutable_script()->set_batch_flag(v); })},
                 {"grad_accum_flag",
                  String([&](const std::string& v) { spec.mutable_script()->set_grad_accum_flag(v); })},
             })},
            {"optimizer",
             Mapping({
                 {"kind", EnumField<fitrun::v1::OptimizerKind>(
                              OptimizerNames(), [&](fitrun::v1::OptimizerKind v) { optimizer->set_kind(v); })},
                 {"lr", Double([&](double v) { optimizer->set_lr(v); })},
                 {"momentum", Double([&](double v) { optimizer->set_momentum(v); })},
                 {"weight_decay", Double([&](double v) { optimizer->set_weight_decay(v); })},
                 {"lr_scaling", EnumField<fitrun::v1::LrScaling>(
                                    {{"none", fitrun::v1::LR_SCALING_NONE},
                                     {"linear", fitrun::v1::LR_SCALING_LINEAR},
                                     {"sqrt", fitrun::v1::LR_SCALING_SQRT}},
                                    [&](fitrun::v1::LrScaling v) { optimizer->set_lr_scaling(v); })},
                 {"reference_batch_size", Int([&](int64_t v) { optimizer->set_reference_batch_size(v); })},
             })},
            {"global_batch_size", Int([&](int64_t v) { spec.set_global_batch_size(v); })},
            {"epochs", Int([&](int64_t v) { spec.set_epochs(static_cast<int32_t>(v)); })},
            {"max_steps", Int([&](int64_t v) { spec.set_max_steps(v); })},
            {"precision", EnumField<fitrun::v1::Precision>(
                              PrecisionNames(), [&](fitrun::v1::Precision v) { spec.set_precision(v); })},
            {"resources",
             Mapping({
                 {"min_devices", Int([&](int64_t v) { resources->set_min_devices(static_cast<int32_t>(v)); })},
                 {"max_devices", Int([&](int64_t v) { resources->set_max_devices(static_cast<int32_t>(v)); })},
                 {"per_device_batch", Int([&](int64_t v) { resources->set_per_device_batch(v); })},
                 {"memory_headroom", Double([&](double v) { resources->set_memory_headroom(v); })},
                 {"min_nodes", Int([&](int64_t v) { resources->set_min_nodes(static_cast<int32_t>(v)); })},
                 {"max_nodes", Int([&](int64_t v) { resources->set_max_nodes(static_cast<int32_t>(v)); })},
                 {"time_limit_minutes",
                  Int([&](int64_t v) { resources->set_time_limit_minutes(static_cast<int32_t>(v)); })},
             })},
            {"checkpoint",
             Mapping({
                 {"every_steps", Int([&](int64_t v) { checkpoint->set_every_steps(v); })},
                 {"keep_last", Int([&](int64_t v) { checkpoint->set_keep_last(static_cast<int32_t>(v)); })},
             })},
            {"ddp", Mapping({
                        {"bucket_cap_mb", Double([&](double v) { ddp->set_bucket_cap_mb(v); })},
                        {"collective_timeout_seconds",
                         Int([&](int64_t v) { ddp->set_collective_timeout_seconds(static_cast<int32_t>(v)); })},
                        {"comm_hook", EnumField<fitrun::v1::CommHook>(
                                          CommHookNames(), [&](fitrun::v1::CommHook v) { ddp->set_comm_hook(v); })},
                        {"powersgd_rank",
                         Int([&](int64_t v) {
                           ddp->set_powersgd_rank(static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)));
                         })},
                        {"powersgd_start_iter", Int([&](int64_t v) { ddp->set_powersgd_start_iter(v); })},
                    })},
            {"seed", Int([&](int64_t v) { spec.set_seed(static_cast<uint64_t>(v)); })},
            {"priority", Int([&](int64_t v) { spec.set_priority(static_cast<int32_t>(v)); })},
            {"fault_tolerance",
             Mapping({
                 {"max_restarts", Int([&](int64_t v) { spec.mutable_fault_tolerance()->set_max_restarts(static_cast<int32_t>(v)); })},
                 {"max_oom_retries", Int([&](int64_t v) { spec.mutable_fault_tolerance()->set_max_oom_retries(static_cast<int32_t>(v)); })},
                 {"heartbeat_timeout_seconds",
                  Int([&](int64_t v) { spec.mutable_fault_tolerance()->set_heartbeat_timeout_seconds(static_cast<int32_t>(v)); })},
                 {"stop_grace_seconds", Double([&](double v) { spec.mutable_fault_tolerance()->set_stop_grace_seconds(v); })},
             })},
            {"fault_injection",
             Mapping({
                 {"kind", EnumField<fitrun::v1::FaultInjection::Kind>(
                              {{"exit", fitrun::v1::FaultInjection::KIND_EXIT},
                               {"oom", fitrun::v1::FaultInjection::KIND_OOM}},
                              [&](fitrun::v1::FaultInjection::Kind v) { fault->set_kind(v); })},
                 {"rank", Int([&](int64_t v) { fault->set_rank(static_cast<int32_t>(v)); })},
                 {"at_step", Int([&](int64_t v) { fault->set_at_step(v); })},
                 {"exit_code", Int([&](int64_t v) { fault->set_exit_code(static_cast<int32_t>(v)); })},
                 {"attempt", Int([&](int64_t v) { fault->set_attempt(static_cast<int32_t>(v)); })},
             })},
        });
    if (!status.ok()) return status;
    clear_unused();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec: could not read YAML at line ", e.mark.line + 1, ": ", e.msg));
  }
  return spec;
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  const std::string& name = spec.name();
  if (name.empty()) return FieldError("spec.name", "required; give the job a short name such as fashion-mnist-mlp");
  if (name.size() > 63) return FieldError("spec.name", absl::StrCat("at most 63 characters (got ", name.size(), ")"));
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return FieldError("spec.name", absl::StrCat("use letters, digits, '-', '_' or '.' only (got '", name, "')"));
    }
  }

  const bool script = spec.has_script();
  if (absl::Status s = script ? ValidateScript(spec) : ValidateModelAndData(spec); !s.ok()) return s;

  if (spec.global_batch_size() <= 0) {
    return FieldError("spec.global_batch_size",
                      absl::StrCat("must be a positive number of samples per step (got ", spec.global_batch_size(), ")"));
  }
  if (spec.epochs() < 0) return FieldError("spec.epochs", absl::StrCat("must be >= 0 (got ", spec.epochs(), ")"));
  if (spec.max_steps() < 0) {
    return FieldError("spec.max_steps", absl::StrCat("must be >= 0 (got ", spec.max_steps(), ")"));
  }
  if (spec.epochs() == 0 && spec.max_steps() == 0 && !script) {
    return FieldError("spec.epochs", "set epochs or max_steps to say how long to train");
  }

  const auto& optimizer = spec.optimizer();
  // A script brings its own optimizer; fitrun only scales the lr it is given (FITRUN_LR).
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

  // bf16 runs as autocast on CPU devices; fp16 needs CUDA's loss scaling, and devices here are CPUs.
  if (spec.precision() == fitrun::v1::PRECISION_FP16) {
    return FieldError("spec.precision", "fp16 needs CUDA devices (AMP with a gradient scaler); use bf16 or fp32");
  }

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

  if (spec.checkpoint().every_steps() < 0) {
    return FieldError("spec.checkpoint.every_steps", absl::StrCat("must be >= 0 (got ", spec.checkpoint().every_steps(), ")"));
  }
  if (spec.checkpoint().keep_last() < 0) {
    return FieldError("spec.checkpoint.keep_last", absl::StrCat("must be >= 1 (got ", spec.checkpoint().keep_last(), ")"));
  }
  if (spec.ddp().bucket_cap_mb() < 0) {
    return FieldError("spec.ddp.bucket_cap_mb", absl::StrCat("must be > 0 (got ", spec.ddp().bucket_cap_mb(), ")"));
  }
  if (spec.ddp().collective_timeout_seconds() < 0) {
    return FieldError("spec.ddp.collective_timeout_seconds",
                      absl::StrCat("must be > 0 (got ", spec.ddp().collective_timeout_seconds(), ")"));
  }
  if (absl::Status s = ValidateCommHook(spec); !s.ok()) return s;

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

void ApplyJobSpecDefaults(JobSpec& spec) {
  auto* optimizer = spec.mutable_optimizer();
  if (optimizer->lr_scaling() == fitrun::v1::LR_SCALING_UNSPECIFIED) {
    optimizer->set_lr_scaling(fitrun::v1::LR_SCALING_NONE);
  }
  if (optimizer->reference_batch_size() == 0) optimizer->set_reference_batch_size(spec.global_batch_size());
  if (spec.precision() == fitrun::v1::PRECISION_UNSPECIFIED) spec.set_precision(fitrun::v1::PRECISION_FP32);
  auto* resources = spec.mutable_resources();
  if (resources->min_devices() == 0) resources->set_min_devices(1);
  if (resources->memory_headroom() == 0) resources->set_memory_headroom(0.1);
  if (spec.checkpoint().keep_last() == 0) spec.mutable_checkpoint()->set_keep_last(2);
  auto* ddp = spec.mutable_ddp();
  if (ddp->bucket_cap_mb() == 0) ddp->set_bucket_cap_mb(25);
  if (ddp->collective_timeout_seconds() == 0) ddp->set_collective_timeout_seconds(60);
  if (ddp->comm_hook() == fitrun::v1::COMM_HOOK_UNSPECIFIED) ddp->set_comm_hook(fitrun::v1::COMM_HOOK_NONE);
  if (ddp->comm_hook() == fitrun::v1::COMM_HOOK_POWERSGD) {
    // PyTorch's PowerSGDState defaults.
    if (!ddp->has_powersgd_rank()) ddp->set_powersgd_rank(1);
    if (!ddp->has_powersgd_start_iter()) ddp->set_powersgd_start_iter(1000);
  }
  auto* tolerance = spec.mutable_fault_tolerance();
  if (!tolerance->has_max_restarts()) tolerance->set_max_restarts(3);
  if (!tolerance->has_max_oom_retries()) tolerance->set_max_oom_retries(3);
  if (tolerance->heartbeat_timeout_seconds() == 0) tolerance->set_heartbeat_timeout_seconds(60);
  if (tolerance->stop_grace_seconds() == 0) tolerance->set_stop_grace_seconds(2);
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
  if (absl::Status status = ValidateJobSpec(spec); !status.ok()) return status;
  ApplyJobSpecDefaults(spec);
  return spec;
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
