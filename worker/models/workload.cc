#include "worker/models/workload.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/fashion_mnist.h"
#include "worker/data/text.h"
#include "worker/models/gpt.h"

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
  absl::StatusOr<LabeledImages> train = LoadTextWindows(spec.data().path(), config.context(), Split::kTrain);
  if (!train.ok()) return DataError(train.status());
  workload.train = *std::move(train);
  if (with_test) {
    absl::StatusOr<LabeledImages> test = LoadTextWindows(spec.data().path(), config.context(), Split::kTest);
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

// mlp, cnn and TorchScript modules: image classifiers on Fashion-MNIST.
absl::StatusOr<Workload> LoadClassifier(const fitrun::v1::JobSpec& spec, bool with_test,
                                        const std::string& name) {
  if (absl::Status s = RequireDataKind(spec, fitrun::v1::DATA_KIND_FASHION_MNIST, name, "fashion_mnist");
      !s.ok()) {
    return s;
  }
  Workload workload;
  absl::StatusOr<LabeledImages> train = LoadFashionMnist(spec.data().path(), Split::kTrain);
  if (!train.ok()) return DataError(train.status());
  workload.train = *std::move(train);
  if (with_test) {
    absl::StatusOr<LabeledImages> test = LoadFashionMnist(spec.data().path(), Split::kTest);
    if (!test.ok()) return DataError(test.status());
    workload.test = *std::move(test);
  }
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(spec.model(), spec.seed());
  if (!model.ok()) return model.status();
  workload.model = *std::move(model);
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
    if (model.builtin() == "mlp" || model.builtin() == "cnn") return LoadClassifier(spec, with_test, model.builtin());
  }
  // CreateModel explains what is missing or unknown.
  absl::StatusOr<std::shared_ptr<Model>> unknown = CreateModel(model, spec.seed());
  return unknown.ok() ? absl::InternalError("unreachable: a model without a workload") : unknown.status();
}

}  // namespace fitrun::worker
