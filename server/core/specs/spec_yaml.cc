// Job specs as people write them: YAML mapped onto the JobSpec message field by field, every unknown
// field, wrong type and unknown name an error naming the field's path and line.
#include "server/core/specs/job_specs.h"


#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/errors.h"
#include "server/core/specs/spec_names.h"

namespace fitrun::server {
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

// The spec's sections, each a reader that writes into `job` (which must outlive it).
FieldReader ModelFields(JobSpec* job) {
  auto* model = job->mutable_model();
  return Mapping({
      {"builtin", String([model](const std::string& v) { model->set_builtin(v); })},
      {"torchscript", String([model](const std::string& v) { model->set_torchscript(v); })},
      {"gpt", Mapping({
                  {"layers", Int([model](int64_t v) { model->mutable_gpt()->set_layers(static_cast<int32_t>(v)); })},
                  {"heads", Int([model](int64_t v) { model->mutable_gpt()->set_heads(static_cast<int32_t>(v)); })},
                  {"hidden", Int([model](int64_t v) { model->mutable_gpt()->set_hidden(static_cast<int32_t>(v)); })},
                  {"context", Int([model](int64_t v) { model->mutable_gpt()->set_context(static_cast<int32_t>(v)); })},
                  {"tied_head", Bool([model](bool v) { model->mutable_gpt()->set_tied_head(v); })},
                  {"activation_checkpointing",
                   Bool([model](bool v) { model->mutable_gpt()->set_activation_checkpointing(v); })},
              })},
      {"sasrec", Mapping({
                     {"max_len", Int([model](int64_t v) { model->mutable_sasrec()->set_max_len(static_cast<int32_t>(v)); })},
                     {"hidden", Int([model](int64_t v) { model->mutable_sasrec()->set_hidden(static_cast<int32_t>(v)); })},
                     {"blocks", Int([model](int64_t v) { model->mutable_sasrec()->set_blocks(static_cast<int32_t>(v)); })},
                     {"heads", Int([model](int64_t v) { model->mutable_sasrec()->set_heads(static_cast<int32_t>(v)); })},
                     {"activation_checkpointing",
                      Bool([model](bool v) { model->mutable_sasrec()->set_activation_checkpointing(v); })},
                 })},
  });
}

FieldReader DataFields(JobSpec* job) {
  auto* data = job->mutable_data();
  return Mapping({
      {"kind", EnumField<fitrun::v1::DataKind>(
                   {{"fashion_mnist", fitrun::v1::DATA_KIND_FASHION_MNIST},
                    {"text", fitrun::v1::DATA_KIND_TEXT},
                    {"movielens", fitrun::v1::DATA_KIND_MOVIELENS},
                    {"tensors", fitrun::v1::DATA_KIND_TENSORS}},
                   [data](fitrun::v1::DataKind v) { data->set_kind(v); })},
      {"path", String([data](const std::string& v) { data->set_path(v); })},
      {"target", String([data](const std::string& v) { data->set_target(v); })},
      {"inputs", StringList([data](const std::string& v) { data->add_inputs(v); })},
      {"test_fraction", Double([data](double v) { data->set_test_fraction(v); })},
      {"test_path", String([data](const std::string& v) { data->set_test_path(v); })},
  });
}

FieldReader LossFields(JobSpec* job) {
  const auto set_kind = [job](fitrun::v1::LossKind v) { job->mutable_loss()->set_kind(v); };
  return ScalarOrMapping(EnumField<fitrun::v1::LossKind>(LossNames(), set_kind),
                         {
                             {"kind", EnumField<fitrun::v1::LossKind>(LossNames(), set_kind)},
                             {"ignore_index", Int([job](int64_t v) { job->mutable_loss()->set_ignore_index(v); })},
                         });
}

FieldReader ScriptFields(JobSpec* job) {
  return Mapping({
      {"command", StringList([job](const std::string& v) { job->mutable_script()->add_command(v); })},
      {"working_dir", String([job](const std::string& v) { job->mutable_script()->set_working_dir(v); })},
      {"env", StringMap([job](const std::string& k, const std::string& v) {
         (*job->mutable_script()->mutable_env())[k] = v;
       })},
      {"batch_flag", String([job](const std::string& v) { job->mutable_script()->set_batch_flag(v); })},
      {"grad_accum_flag",
       String([job](const std::string& v) { job->mutable_script()->set_grad_accum_flag(v); })},
      {"applies_strategy", Bool([job](bool v) { job->mutable_script()->set_applies_strategy(v); })},
      {"activation_checkpointing",
       Bool([job](bool v) { job->mutable_script()->set_activation_checkpointing(v); })},
  });
}

FieldReader OptimizerFields(JobSpec* job) {
  auto* optimizer = job->mutable_optimizer();
  return Mapping({
      {"kind", EnumField<fitrun::v1::OptimizerKind>(
                   OptimizerNames(), [optimizer](fitrun::v1::OptimizerKind v) { optimizer->set_kind(v); })},
      {"lr", Double([optimizer](double v) { optimizer->set_lr(v); })},
      {"momentum", Double([optimizer](double v) { optimizer->set_momentum(v); })},
      {"weight_decay", Double([optimizer](double v) { optimizer->set_weight_decay(v); })},
      {"lr_scaling", EnumField<fitrun::v1::LrScaling>(
                         {{"none", fitrun::v1::LR_SCALING_NONE},
                          {"linear", fitrun::v1::LR_SCALING_LINEAR},
                          {"sqrt", fitrun::v1::LR_SCALING_SQRT}},
                         [optimizer](fitrun::v1::LrScaling v) { optimizer->set_lr_scaling(v); })},
      {"reference_batch_size", Int([optimizer](int64_t v) { optimizer->set_reference_batch_size(v); })},
  });
}

FieldReader ResourcesFields(JobSpec* job) {
  auto* resources = job->mutable_resources();
  return Mapping({
      {"min_devices", Int([resources](int64_t v) { resources->set_min_devices(static_cast<int32_t>(v)); })},
      {"max_devices", Int([resources](int64_t v) { resources->set_max_devices(static_cast<int32_t>(v)); })},
      {"per_device_batch", Int([resources](int64_t v) { resources->set_per_device_batch(v); })},
      {"memory_headroom", Double([resources](double v) { resources->set_memory_headroom(v); })},
      {"min_nodes", Int([resources](int64_t v) { resources->set_min_nodes(static_cast<int32_t>(v)); })},
      {"max_nodes", Int([resources](int64_t v) { resources->set_max_nodes(static_cast<int32_t>(v)); })},
      {"time_limit_minutes",
       Int([resources](int64_t v) { resources->set_time_limit_minutes(static_cast<int32_t>(v)); })},
      {"host_memory", String([resources](const std::string& v) { resources->set_host_memory(v); })},
      {"max_processes", Int([resources](int64_t v) {
         resources->set_max_processes(static_cast<int32_t>(std::clamp<int64_t>(v, -1, INT32_MAX)));
       })},
  });
}

FieldReader CheckpointFields(JobSpec* job) {
  auto* checkpoint = job->mutable_checkpoint();
  return Mapping({
      {"every_steps", Int([checkpoint](int64_t v) { checkpoint->set_every_steps(v); })},
      {"keep_last", Int([checkpoint](int64_t v) { checkpoint->set_keep_last(static_cast<int32_t>(v)); })},
  });
}

FieldReader DdpFields(JobSpec* job) {
  auto* ddp = job->mutable_ddp();
  return Mapping({
      {"bucket_cap_mb", Double([ddp](double v) { ddp->set_bucket_cap_mb(v); })},
      {"collective_timeout_seconds",
       Int([ddp](int64_t v) { ddp->set_collective_timeout_seconds(static_cast<int32_t>(v)); })},
      {"comm_hook", EnumField<fitrun::v1::CommHook>(
                        CommHookNames(), [ddp](fitrun::v1::CommHook v) { ddp->set_comm_hook(v); })},
      {"powersgd_rank",
       Int([ddp](int64_t v) {
         ddp->set_powersgd_rank(static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)));
       })},
      {"powersgd_start_iter", Int([ddp](int64_t v) { ddp->set_powersgd_start_iter(v); })},
      {"zero_stage",
       Int([ddp](int64_t v) {
         ddp->set_zero_stage(static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)));
       })},
  });
}

FieldReader FaultToleranceFields(JobSpec* job) {
  return Mapping({
      {"max_restarts", Int([job](int64_t v) { job->mutable_fault_tolerance()->set_max_restarts(static_cast<int32_t>(v)); })},
      {"max_oom_retries", Int([job](int64_t v) { job->mutable_fault_tolerance()->set_max_oom_retries(static_cast<int32_t>(v)); })},
      {"heartbeat_timeout_seconds",
       Int([job](int64_t v) { job->mutable_fault_tolerance()->set_heartbeat_timeout_seconds(static_cast<int32_t>(v)); })},
      {"stop_grace_seconds", Double([job](double v) { job->mutable_fault_tolerance()->set_stop_grace_seconds(v); })},
  });
}

FieldReader FaultInjectionFields(JobSpec* job) {
  auto* fault = job->mutable_fault_injection();
  return Mapping({
      {"kind", EnumField<fitrun::v1::FaultInjection::Kind>(
                   {{"exit", fitrun::v1::FaultInjection::KIND_EXIT},
                    {"oom", fitrun::v1::FaultInjection::KIND_OOM}},
                   [fault](fitrun::v1::FaultInjection::Kind v) { fault->set_kind(v); })},
      {"rank", Int([fault](int64_t v) { fault->set_rank(static_cast<int32_t>(v)); })},
      {"at_step", Int([fault](int64_t v) { fault->set_at_step(v); })},
      {"exit_code", Int([fault](int64_t v) { fault->set_exit_code(static_cast<int32_t>(v)); })},
      {"attempt", Int([fault](int64_t v) { fault->set_attempt(static_cast<int32_t>(v)); })},
  });
}

}  // namespace

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

  // A script job has neither a model nor data (their readers make both): an unset message stays unset.
  const auto clear_unused = [&] {
    if (spec.model().ByteSizeLong() == 0) spec.clear_model();
    if (spec.data().ByteSizeLong() == 0) spec.clear_data();
  };

  try {
    absl::Status status = ReadMapping(
        root, "spec",
        {
            {"name", String([&](const std::string& v) { spec.set_name(v); })},
            {"model", ModelFields(&spec)},
            {"data", DataFields(&spec)},
            {"loss", LossFields(&spec)},
            {"script", ScriptFields(&spec)},
            {"optimizer", OptimizerFields(&spec)},
            {"global_batch_size", Int([&](int64_t v) { spec.set_global_batch_size(v); })},
            {"epochs", Int([&](int64_t v) { spec.set_epochs(static_cast<int32_t>(v)); })},
            {"max_steps", Int([&](int64_t v) { spec.set_max_steps(v); })},
            {"precision", EnumField<fitrun::v1::Precision>(
                              PrecisionNames(), [&](fitrun::v1::Precision v) { spec.set_precision(v); })},
            {"resources", ResourcesFields(&spec)},
            {"checkpoint", CheckpointFields(&spec)},
            {"ddp", DdpFields(&spec)},
            {"seed", Int([&](int64_t v) { spec.set_seed(static_cast<uint64_t>(v)); })},
            {"priority", Int([&](int64_t v) { spec.set_priority(static_cast<int32_t>(v)); })},
            {"fault_tolerance", FaultToleranceFields(&spec)},
            {"fault_injection", FaultInjectionFields(&spec)},
        });
    if (!status.ok()) return status;
    clear_unused();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec: could not read YAML at line ", e.mark.line + 1, ": ", e.msg));
  }
  return spec;
}

}  // namespace fitrun::server
