#include "worker/models/workload.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "worker/data/fashion_mnist.h"
#include "worker/data/movielens.h"
#include "worker/data/tensors.h"
#include "worker/data/text.h"
#include "worker/models/gpt.h"
#include "worker/models/sasrec.h"
#include "worker/models/torchscript_model.h"

namespace fitrun::worker {
namespace {

absl::Status DataError(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("spec.data.path: ", status.message()));
}

// The training split and, when asked for, the test split of a loader taking a Split.
template <typename LoadSplit>
absl::Status LoadSplits(Workload& workload, bool with_test, LoadSplit load) {
  absl::StatusOr<TensorDataset> train = load(Split::kTrain);
  if (!train.ok()) return train.status();
  workload.train = *std::move(train);
  if (with_test) {
    absl::StatusOr<TensorDataset> test = load(Split::kTest);
    if (!test.ok()) return test.status();
    workload.test = *std::move(test);
  }
  return absl::OkStatus();
}

std::string GptDescription(const fitrun::v1::GptConfig& config) {
  return absl::StrCat("gpt (", config.layers(), " layers, hidden ", config.hidden(), ", ", config.heads(),
                      " heads, context ", config.context(), config.tied_head() ? ", tied head" : "", ")");
}

absl::StatusOr<Workload> LoadGptOnText(const fitrun::v1::JobSpec& spec, bool with_test, DatasetCache*) {
  const fitrun::v1::GptConfig& config = spec.model().gpt();
  if (absl::Status s = ValidateGptConfig(config); !s.ok()) return s;
  Workload workload;
  absl::Status loaded = LoadSplits(workload, with_test, [&](Split split) -> absl::StatusOr<TensorDataset> {
    absl::StatusOr<TensorDataset> set = LoadTextWindows(spec.data().path(), config.context(), split);
    if (!set.ok()) return DataError(set.status());
    return set;
  });
  if (!loaded.ok()) return loaded;
  absl::StatusOr<std::shared_ptr<Model>> model = CreateGpt(config, spec.seed());
  if (!model.ok()) return model.status();
  workload.model = *std::move(model);
  workload.description = GptDescription(config);
  return workload;
}

// sasrec and the gpt recommender: item sequences of a ratings file, sized by its item count.
absl::StatusOr<Workload> LoadOnRatings(const fitrun::v1::JobSpec& spec, bool with_test, int64_t max_len,
                                       absl::StatusOr<std::shared_ptr<Model>> (*create)(const fitrun::v1::JobSpec&,
                                                                                        int64_t num_items),
                                       const std::string& description) {
  absl::StatusOr<MovieLensSplits> splits = LoadMovieLens(spec.data().path(), max_len, spec.seed());
  if (!splits.ok()) return DataError(splits.status());
  absl::StatusOr<std::shared_ptr<Model>> model = create(spec, splits->num_items);
  if (!model.ok()) return model.status();
  Workload workload;
  workload.model = *std::move(model);
  workload.train = std::move(splits->train);
  if (with_test) workload.test = std::move(splits->test);
  workload.description = absl::StrCat(description, ", ", splits->num_items, " items");
  return workload;
}

absl::StatusOr<Workload> LoadSasRec(const fitrun::v1::JobSpec& spec, bool with_test, DatasetCache*) {
  const fitrun::v1::SasRecConfig& config = spec.model().sasrec();
  if (absl::Status s = ValidateSasRecConfig(config); !s.ok()) return s;
  return LoadOnRatings(
      spec, with_test, config.max_len(),
      [](const fitrun::v1::JobSpec& s, int64_t items) { return CreateSasRec(s.model().sasrec(), items, s.seed()); },
      absl::StrCat("sasrec (", config.blocks(), " blocks, hidden ", config.hidden(), ", ", config.heads(),
                   " heads, max_len ", config.max_len()));
}

absl::StatusOr<Workload> LoadGptOnRatings(const fitrun::v1::JobSpec& spec, bool with_test, DatasetCache*) {
  const fitrun::v1::GptConfig& config = spec.model().gpt();
  if (absl::Status s = ValidateGptConfig(config); !s.ok()) return s;
  return LoadOnRatings(
      spec, with_test, config.context(),
      [](const fitrun::v1::JobSpec& s, int64_t items) { return CreateGptRecommender(s.model().gpt(), items, s.seed()); },
      absl::StrCat(GptDescription(config), " next-item recommender"));
}

absl::StatusOr<Workload> LoadBuiltinClassifier(const fitrun::v1::JobSpec& spec, bool with_test,
                                               DatasetCache* cache) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(spec.model(), spec.seed());
  if (!model.ok()) return model.status();
  Workload workload;
  workload.model = *std::move(model);
  absl::Status loaded = LoadSplits(workload, with_test, [&](Split split) -> absl::StatusOr<TensorDataset> {
    absl::StatusOr<TensorDataset> set = LoadFashionMnist(spec.data().path(), split, cache);
    if (!set.ok()) return DataError(set.status());
    return set;
  });
  if (!loaded.ok()) return loaded;
  workload.description = spec.model().builtin();
  return workload;
}

// A TorchScript module on `load`'s data, checked on two training rows.
template <typename LoadSplit>
absl::StatusOr<Workload> LoadTorchScript(const fitrun::v1::JobSpec& spec, bool with_test, LoadSplit load) {
  Workload workload;
  if (absl::Status loaded = LoadSplits(workload, with_test, load); !loaded.ok()) return loaded;
  if (workload.train.size() < 1) return absl::InvalidArgumentError("spec.data.path: no training sample");
  absl::StatusOr<std::shared_ptr<Model>> model = LoadTorchScriptModel(
      spec.model().torchscript(), spec.loss(), workload.train.Slice(0, std::min<int64_t>(2, workload.train.size())),
      spec.seed());
  if (!model.ok()) return model.status();
  workload.model = *std::move(model);
  workload.description = absl::StrCat("torchscript ", spec.model().torchscript());
  return workload;
}

absl::StatusOr<Workload> LoadTorchScriptOnImages(const fitrun::v1::JobSpec& spec, bool with_test,
                                                 DatasetCache* cache) {
  absl::StatusOr<Workload> workload = LoadTorchScript(spec, with_test, [&](Split split) -> absl::StatusOr<TensorDataset> {
    absl::StatusOr<TensorDataset> set = LoadFashionMnist(spec.data().path(), split, cache);
    if (!set.ok()) return DataError(set.status());
    return set;
  });
  if (!workload.ok()) return workload.status();
  // The image classifiers' contract: float32 logits for at least Fashion-MNIST's ten classes.
  const at::Tensor blank = at::zeros({2, 1, 28, 28});
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    workload->model->eval();
    logits = workload->model->Forward({blank});
    workload->model->train();
  }
  if (logits.dim() != 2 || logits.size(0) != 2 || logits.size(1) < 10 || logits.scalar_type() != at::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.model.torchscript: '", spec.model().torchscript(),
        "': forward must return float32 logits [B, classes >= 10]; for [2, 1, 28, 28] it returned ",
        c10::toString(logits.scalar_type()), " [", absl::StrJoin(logits.sizes(), ", "), "]"));
  }
  return workload;
}

absl::StatusOr<Workload> LoadTorchScriptOnTensors(const fitrun::v1::JobSpec& spec, bool with_test, DatasetCache*) {
  return LoadTorchScript(spec, with_test, [&](Split split) { return LoadTensors(spec.data(), split); });
}

}  // namespace

const std::vector<WorkloadKind>& WorkloadKinds() {
  static const auto* kinds = new std::vector<WorkloadKind>{
      {"mlp", fitrun::v1::DATA_KIND_FASHION_MNIST, LoadBuiltinClassifier},
      {"cnn", fitrun::v1::DATA_KIND_FASHION_MNIST, LoadBuiltinClassifier},
      {"gpt", fitrun::v1::DATA_KIND_TEXT, LoadGptOnText},
      {"gpt", fitrun::v1::DATA_KIND_MOVIELENS, LoadGptOnRatings},
      {"sasrec", fitrun::v1::DATA_KIND_MOVIELENS, LoadSasRec},
      {"torchscript", fitrun::v1::DATA_KIND_FASHION_MNIST, LoadTorchScriptOnImages},
      {"torchscript", fitrun::v1::DATA_KIND_TENSORS, LoadTorchScriptOnTensors},
  };
  return *kinds;
}

namespace {
// "text", as specs name data kinds.
std::string DataKindName(fitrun::v1::DataKind kind) {
  return absl::AsciiStrToLower(absl::StripPrefix(fitrun::v1::DataKind_Name(kind), "DATA_KIND_"));
}
}  // namespace

std::string ModelKindName(const fitrun::v1::ModelSpec& model) {
  return model.kind_case() == fitrun::v1::ModelSpec::kTorchscript ? "torchscript" : model.builtin();
}

absl::StatusOr<Workload> LoadWorkload(const fitrun::v1::JobSpec& spec, bool with_test,
                                      DatasetCache* cache) {
  const std::string model = ModelKindName(spec.model());
  // Specs from before data kinds existed leave Fashion-MNIST's unset.
  const fitrun::v1::DataKind data =
      spec.data().kind() == fitrun::v1::DATA_KIND_UNSPECIFIED ? fitrun::v1::DATA_KIND_FASHION_MNIST : spec.data().kind();
  std::vector<std::string> kinds_for_model;
  for (const WorkloadKind& kind : WorkloadKinds()) {
    if (kind.model != model) continue;
    if (kind.data == data) return kind.load(spec, with_test, cache);
    kinds_for_model.push_back(DataKindName(kind.data));
  }
  if (kinds_for_model.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.model: unknown model '", model,
                                                   "' (known: mlp, cnn, gpt, sasrec, or a torchscript file)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("spec.data.kind: ", model, " trains on ",
                                                 absl::StrJoin(kinds_for_model, " or "), " data (got ",
                                                 DataKindName(spec.data().kind()), ")"));
}

}  // namespace fitrun::worker
