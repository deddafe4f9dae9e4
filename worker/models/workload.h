#ifndef FITRUN_WORKER_MODELS_WORKLOAD_H_
#define FITRUN_WORKER_MODELS_WORKLOAD_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "worker/data/dataset_cache.h"
#include "worker/data/tensor_dataset.h"
#include "worker/models/model.h"

namespace fitrun::worker {

// A spec's model together with the data it trains and is tested on, which is how a worker gets
// both: some models are sized by their data (sasrec's and the recommender's item count) and every
// model reads its own dataset layout.
struct Workload {
  std::shared_ptr<Model> model;
  TensorDataset train;
  // Loaded only when asked for (rank 0 evaluates).
  std::optional<TensorDataset> test;
  // "gpt (2 layers, hidden 128, 4 heads, context 64)", for the job's log.
  std::string description;
};

// The worker's side of each workload: a model kind ("mlp", "cnn", "gpt", "sasrec", or "torchscript")
// on a data kind, and how to load the two. One entry per pair (fitrund keeps the same pairs, with
// their checks and memory profiles, in server/core/specs/workloads.h); a new model or data kind is one
// entry here. `cache`, when not null, is the rank's decoded-dataset cache (the loaders of IDX files
// read through it).
struct WorkloadKind {
  std::string model;
  fitrun::v1::DataKind data;
  absl::StatusOr<Workload> (*load)(const fitrun::v1::JobSpec& spec, bool with_test, DatasetCache* cache);
};
const std::vector<WorkloadKind>& WorkloadKinds();

// The spec's model kind as WorkloadKind::model names it ("torchscript" for a TorchScript file).
std::string ModelKindName(const fitrun::v1::ModelSpec& model);

// Loads the data a spec names and builds its model with the spec's seed. Errors are
// InvalidArgument naming the spec field (spec.data.kind for a pair no entry has, spec.data.path,
// spec.model.gpt.heads, ...). With a `cache` (WorkerAssignment.dataset_cache_dir), datasets another
// rank or attempt already decoded are mapped from it rather than decoded again.
absl::StatusOr<Workload> LoadWorkload(const fitrun::v1::JobSpec& spec, bool with_test,
                                      DatasetCache* cache = nullptr);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_WORKLOAD_H_
