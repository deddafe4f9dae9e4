// The workloads fitrund plans: each built-in model and TorchScript models, on the data kinds each
// trains on. One entry per (model, data kind) pair holds what differs between workloads on the
// coordinator's side: the checks of the model's config and its data at submit, the analytic memory
// profile plans start from before the probe has measured the workload, and what besides the model
// sizes its memory (part of its calibration key). The worker keeps the same pairs with their loaders
// (worker/models/workload.h); a new model or data kind is one entry on each side.
#ifndef FITRUN_SERVER_CORE_SPECS_WORKLOADS_H_
#define FITRUN_SERVER_CORE_SPECS_WORKLOADS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/specs/workload_profiles.h"

namespace fitrun::server {

struct WorkloadKind {
  std::string model;  // "mlp", "cnn", "gpt", "sasrec", or "torchscript" for a TorchScript file
  fitrun::v1::DataKind data;
  // The model's config and the data the spec names (files present, shapes), field paths in errors;
  // records in `facts` what planning needs of those files (the one time they are read).
  absl::Status (*validate)(const fitrun::v1::JobSpec& spec, fitrun::v1::SpecFileFacts* facts);
  // From the spec and its file_facts alone: no file is opened.
  absl::StatusOr<ModelProfile> (*profile)(const fitrun::v1::JobSpec& spec);
  // The model's config and whatever else sizes its memory (a file's version), for calibration keys.
  std::string (*memory_key)(const fitrun::v1::JobSpec& spec);
  // Whether `profile` is known to be an upper bound of the measured peak: checked, for every
  // optimizer and precision, by the estimator accuracy bench (server/bench/memory_accuracy). Only
  // such a workload may launch on its analytic estimate without a probe (when memory is roomy).
  bool analytic_is_upper_bound = false;
};
const std::vector<WorkloadKind>& WorkloadKinds();

// The spec's entry, or INVALID_ARGUMENT naming spec.model or spec.data.kind and what would do.
absl::StatusOr<const WorkloadKind*> FindWorkload(const fitrun::v1::JobSpec& spec);

// Checks the model and data of a spec that has no script: the pair exists, and its entry's checks,
// which record what planning needs of the spec's files in `facts`.
absl::Status ValidateModelAndData(const fitrun::v1::JobSpec& spec, fitrun::v1::SpecFileFacts* facts);

// The analytic profile of a spec's model on its dataset (a script's is empty until its probe
// measures it), from the spec and its file_facts alone; errors name the spec field.
absl::StatusOr<ModelProfile> ProfileFor(const fitrun::v1::JobSpec& spec);

// Whether the spec's analytic profile is a checked upper bound (never for a script).
bool AnalyticEstimateIsUpperBound(const fitrun::v1::JobSpec& spec);

// How a rank trains beyond its batch, where the planner may choose: activation checkpointing (a
// gpt's or sasrec's blocks recomputed in backward, or a script's that applies_strategy, as the
// script does it). Whether the spec's model has it;
bool CanCheckpointActivations(const fitrun::v1::JobSpec& spec);
// what the spec says of it: true pins it, false forbids it (and every model without it), nullopt
// leaves it to the plan;
std::optional<bool> SpecActivationCheckpointing(const fitrun::v1::JobSpec& spec);
// the spec with it set (unchanged for a model without it);
fitrun::v1::JobSpec WithActivationCheckpointing(fitrun::v1::JobSpec spec, bool on);
// and the spec as its plan trains it, the plan's choice written in: what the ranks get, and what
// their peaks and out-of-memory errors are measurements of.
fitrun::v1::JobSpec SpecAsPlanned(const fitrun::v1::JobSpec& spec, const fitrun::v1::Plan& plan);

// The entry's memory key for the spec (its model's config and what else sizes its memory).
std::string WorkloadMemoryKey(const fitrun::v1::JobSpec& spec);

// The version of `path` recorded in spec.file_facts at submit ("<path>@<mtime ns>:<size>"), or
// "<path>@unread": a rewritten file is a new model or dataset.
std::string RecordedVersion(const fitrun::v1::JobSpec& spec, const std::string& path);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_WORKLOADS_H_
