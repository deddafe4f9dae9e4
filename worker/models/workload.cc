#include "worker/models/workload.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/fashion_mnist.h"
#include "worker/data/movielens.h"
#include "worker/data/text.h"
#include "worker/models/gpt.h"
#include "worker/models/sasrec.h"

namespace fitrun::worker {
namespace {

absl::Status DataError(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("spec.data.path: ", status.message()));
}

absl::Status RequireDataKind(const fitrun::v1::JobSpec& spec, fitrun::v1::DataKind kind,
                             const std::string& model, const std::string& kind_name) {
  if (spec.data().kind() == kind) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("spec.data.kind: ", model, " trains on ", kind_name,
                                                 " data (got ", fitrun::v1::DataKind_Name(spec.data().kind()),
                                                 ")"));
}

absl::StatusOr<Workload> LoadGpt(const fitrun::v1::JobSpec& spec, bool with_test) {
  const fitrun::v1::GptConfig& config = spec.model().gpt();
  if (absl::Status s = RequireDataKind(spec, fitrun::v1::DATA_KIND_TEXT, "gpt", "text"); !s.ok()) return s;
  if (absl::Status s = ValidateGptConfig(config); !s.ok()) return s;
  Workload workload;
  absl::StatusOr<TensorDataset> train = LoadTextWindows(spec.data().path(), config.context(), Split::kTrain);
  if (!train.ok()) return DataError(train.status());
  workload.train = *std::move(train);
  if (with_test) {
    absl::StatusOr<TensorDataset> test = LoadTextWindows(spec.data().path(), config.context(), Split::kTest);
    if (!test.ok()) return DataError(test.status());
    workload.test = *std::move(test);
  }
  absl::StatusOr<std::shared_ptr<Model>> model = CreateGpt(config, spec.seed());
  if (!model.ok()) return model.status();
  workload.model = *std::move(model);
  workload.description = absl::StrCat("gpt (", config.layers(), " layers, hidden ", config.hidden(), ", ",
                                      config.heads(), " heads, context ", config.context(),
                                      config.tied_head() ? ", tied head" : "", ")");
  return workload;
}

absl::StatusOr<Workload> LoadSasRec(const fitrun::v1::JobSpec& spec, bool with_test) {
  const fitrun::v1::SasRecConfig& config = spec.model().sasrec();
  if (absl::Status s = RequireDataKind(spec, fitrun::v1::DATA_KIND_MOVIELENS, "sasrec", "movielens"); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateSasRecConfig(config); !s.ok()) return s;
  absl::StatusOr<MovieLensSplits> splits = LoadMovieLens(spec.data().path(), config.max_len(), spec.seed());
  if (!splits.ok()) return DataError(splits.status());
  absl::StatusOr<std::shared_ptr<Model>> model = CreateSasRec(config, splits->num_items, spec.seed());
  if (!model.ok()) return model.status();
  Workload workload;
  workload.model = *std::move(model);
  workload.train = std::move(splits->train);
  if (with_test) workload.test = std::move(splits->test);
  workload.description = absl::StrCat("sasrec (", config.blocks(), " blocks, hidden ", config.hidden(), ", ",
                                      config.heads(), " heads, max_len ", config.max_len(), ", ",
                                      splits->num_items, " items)");
  return workload;
}

// mlp, cnn and TorchScript modules: image classifiers on Fashion-MNIST.
absl::StatusOr<Workload> LoadClassifier(const fitrun::v1::JobSpec& spec, bool with_test,
                                        const std::string& name) {
  // The model first: an unknown or broken model is the more useful error than the data kind.
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(spec.model(), spec.seed());
  if (!model.ok()) return model.status();
  // Specs from before other data kinds existed leave the kind unset.
  if (spec.data().kind() != fitrun::v1::DATA_KIND_UNSPECIFIED) {
    if (absl::Status s = RequireDataKind(spec, fitrun::v1::DATA_KIND_FASHION_MNIST, name, "fashion_mnist");
        !s.ok()) {
      return s;
    }
  }
  Workload workload;
  workload.model = *std::move(model);
  absl::StatusOr<TensorDataset> train = LoadFashionMnist(spec.data().path(), Split::kTrain);
  if (!train.ok()) return DataError(train.status());
  workload.train = *std::move(train);
  if (with_test) {
    absl::StatusOr<TensorDataset> test = LoadFashionMnist(spec.data().path(), Split::kTest);
    if (!test.ok()) return DataError(test.status());
    workload.test = *std::move(test);
  }
  workload.description = name;
  return workload;
}

}  // namespace

absl::StatusOr<Workload> LoadWorkload(const fitrun::v1::JobSpec& spec, bool with_test) {
  const fitrun::v1::ModelSpec& model = spec.model();
  if (model.kind_case() == fitrun::v1::ModelSpec::kTorchscript) {
    return LoadClassifier(spec, with_test, absl::StrCat("torchscript ", model.torchscript()));
  }
  if (model.kind_case() == fitrun::v1::ModelSpec::kBuiltin) {
    if (model.builtin() == "gpt") return LoadGpt(spec, with_test);
    if (model.builtin() == "sasrec") return LoadSasRec(spec, with_test);
  }
  // mlp and cnn, or a spec CreateModel rejects with the reason.
  return LoadClassifier(spec, with_test, model.builtin());
}

}  // namespace fitrun::worker
