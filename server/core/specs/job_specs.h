// Job specs as people write them (YAML, spec_yaml.cc) and as the coordinator accepts them (validated,
// defaulted: spec_rules.cc).
//
// Every error names the field by its path as written in the YAML (`spec.optimizer.lr`) and says what
// would be accepted, so a user can fix a spec from the message alone. Nothing here touches the
// store or the devices: a spec is judged on its own.
#ifndef FITRUN_SERVER_CORE_SPECS_JOB_SPECS_H_
#define FITRUN_SERVER_CORE_SPECS_JOB_SPECS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/specs/spec_defaults.h"

namespace fitrun::server {

// Maps YAML text onto a JobSpec. Unknown fields, wrong types and unknown enum names are
// INVALID_ARGUMENT errors naming the field. The result is not yet validated.
absl::StatusOr<fitrun::v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml_text);

// A spec's relative paths are relative to the client that sent it: script.working_dir,
// model.torchscript, data.path and data.test_path are made absolute against `client_dir` (the
// client's working directory, sent with the request).
absl::Status ResolveClientPaths(fitrun::v1::JobSpec& spec, const std::string& client_dir);

// The index in script.command of the script file a Python interpreter runs (the first argument that
// is not a flag), or nullopt when the program is not Python or runs a module (-m) or code (-c).
std::optional<int> ScriptFileIndex(const fitrun::v1::ScriptSpec& script);

// Checks ranges and cross-field rules (INVALID_ARGUMENT naming the field), including that the
// dataset's files exist where data.path says; what planning needs of the files it reads goes to
// `facts` when given (spec_files.h says how they are read).
absl::Status ValidateJobSpec(const fitrun::v1::JobSpec& spec, fitrun::v1::SpecFileFacts* facts = nullptr);

// spec.resources.host_memory and max_processes per rank: the least a rank's process needs, and the
// tasks (processes and threads) a rank gets when the spec does not say. A rank's host memory by
// default depends on its device: a CPU device's memory (which its tensors fill) plus
// kRankProcessHostBytes for the process itself, kGpuRankHostBytes on a GPU.
inline constexpr int64_t kMinHostMemoryPerRank = int64_t{64} << 20;
inline constexpr int kMinProcessesPerRank = 32;
inline constexpr int kDefaultProcessesPerRank = spec_defaults::kMaxProcessesPerRank;
inline constexpr int64_t kRankProcessHostBytes = int64_t{2} << 30;
inline constexpr int64_t kGpuRankHostBytes = int64_t{4} << 30;

// Fills every optional field with its documented default so that a stored spec is explicit.
void ApplyJobSpecDefaults(fitrun::v1::JobSpec& spec);

// Validate and default, with the spec's file_facts read anew (any it came with are dropped): what
// SubmitJob and PlanJob accept. Reads the spec's files: call it as the job's owner, never under a
// lock.
absl::StatusOr<fitrun::v1::JobSpec> NormalizeJobSpec(fitrun::v1::JobSpec spec);

// Names used in YAML and in messages ("sgd", "fp32", "fashion_mnist", ...).
absl::string_view OptimizerKindName(fitrun::v1::OptimizerKind kind);
absl::string_view PrecisionName(fitrun::v1::Precision precision);
absl::string_view JobStateName(fitrun::v1::JobState state);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_JOB_SPECS_H_
