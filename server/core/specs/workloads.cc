#include "server/core/specs/workloads.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/contract/data_contract.h"
#include "server/core/errors.h"
#include "server/core/specs/spec_files.h"
#include "server/core/specs/tensor_file.h"

namespace fitrun::server {
namespace {

using fitrun::v1::JobSpec;
using fitrun::v1::SpecFileFacts;

std::string ModelKindName(const fitrun::v1::ModelSpec& model) {
  return model.kind_case() == fitrun::v1::ModelSpec::kTorchscript ? "torchscript" : model.builtin();
}

// "fashion_mnist", as specs name data kinds.
std::string DataKindName(fitrun::v1::DataKind kind) {
  switch (kind) {
    case fitrun::v1::DATA_KIND_FASHION_MNIST: return "fashion_mnist";
    case fitrun::v1::DATA_KIND_TEXT: return "text";
    case fitrun::v1::DATA_KIND_MOVIELENS: return "movielens";
    case fitrun::v1::DATA_KIND_TENSORS: return "tensors";
    default: return fitrun::v1::DataKind_Name(kind);
  }
}

absl::Status RequirePositive(const std::string& path, int64_t value) {
  if (value >= 1) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be >= 1 (got ", value, ")"));
}

// The file a field names, opened as spec_files.h opens them, its version recorded in `facts`.
absl::StatusOr<SpecFile> RequireFile(const std::string& path, const std::string& field, absl::string_view what,
                                     SpecFileFacts* facts) {
  if (path.empty()) return FieldError(field, absl::StrCat("required; ", what));
  absl::StatusOr<SpecFile> file = SpecFile::Open(path);
  if (absl::IsNotFound(file.status())) {
    return FieldError(field, absl::StrCat("no file '", path, "' on the coordinator's machine; ", what));
  }
  if (!file.ok()) return FieldError(field, file.status().message());
  (*facts->mutable_versions())[path] = file->version();
  return file;
}

// The bytes one sample of a tensors file takes over every tensor (its shape past dimension 0).
int64_t SampleBytes(const std::map<std::string, TensorInfo>& tensors) {
  int64_t sample_bytes = 0;
  for (const auto& [key, info] : tensors) {
    int64_t elements = 1;
    for (size_t d = 1; d < info.shape.size(); ++d) elements *= info.shape[d];
    const int64_t element_bytes = info.dtype == "float64" || info.dtype == "int64"                                   ? 8
                                  : info.dtype == "float32" || info.dtype == "int32"                                 ? 4
                                  : info.dtype == "float16" || info.dtype == "bfloat16" || info.dtype == "int16" ? 2
                                                                                                                  : 1;
    sample_bytes += elements * element_bytes;
  }
  return sample_bytes;
}

// ---- models' configs ------------------------------------------------------------------------------

absl::Status ValidateGptConfig(const JobSpec& spec) {
  if (!spec.model().has_gpt()) {
    return FieldError("spec.model.gpt", "required for builtin gpt; e.g. {layers: 2, heads: 4, hidden: 128, context: 64}");
  }
  const fitrun::v1::GptConfig& gpt = spec.model().gpt();
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"layers", gpt.layers()},
                                     {"heads", gpt.heads()},
                                     {"hidden", gpt.hidden()},
                                     {"context", gpt.context()}}) {
    if (absl::Status s = RequirePositive(absl::StrCat("spec.model.gpt.", field), value); !s.ok()) return s;
  }
  if (gpt.hidden() % gpt.heads() != 0) {
    return FieldError("spec.model.gpt.heads", absl::StrCat("must divide hidden (", gpt.hidden(),
                                                           " is not a multiple of ", gpt.heads(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSasRecConfig(const JobSpec& spec) {
  if (!spec.model().has_sasrec()) {
    return FieldError("spec.model.sasrec", "required for builtin sasrec; e.g. {max_len: 50, hidden: 64, blocks: 2, heads: 1}");
  }
  const fitrun::v1::SasRecConfig& sasrec = spec.model().sasrec();
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"max_len", sasrec.max_len()},
                                     {"hidden", sasrec.hidden()},
                                     {"blocks", sasrec.blocks()},
                                     {"heads", sasrec.heads()}}) {
    if (absl::Status s = RequirePositive(absl::StrCat("spec.model.sasrec.", field), value); !s.ok()) return s;
  }
  if (sasrec.hidden() % sasrec.heads() != 0) {
    return FieldError("spec.model.sasrec.heads", absl::StrCat("must divide hidden (", sasrec.hidden(),
                                                              " is not a multiple of ", sasrec.heads(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTorchScriptFile(const JobSpec& spec, SpecFileFacts* facts) {
  absl::StatusOr<SpecFile> file = RequireFile(spec.model().torchscript(), "spec.model.torchscript",
                                              "a file saved by torch.jit.script(module).save(path)", facts);
  if (!file.ok()) return file.status();
  facts->set_torchscript_bytes(file->size());
  return absl::OkStatus();
}

// ---- data ---------------------------------------------------------------------------------------

// The four IDX files the worker reads; the training images' count is the epoch's samples (a subset of
// Fashion-MNIST has fewer than its 60,000).
absl::Status ValidateFashionMnistDir(const JobSpec& spec, SpecFileFacts* facts) {
  if (spec.data().path().empty()) {
    return FieldError("spec.data.path", "required; the directory holding the dataset's files, e.g. "
                                        "/usr/share/datasets/fashion-mnist");
  }
  std::error_code error;
  if (!std::filesystem::is_directory(spec.data().path(), error)) {
    return FieldError("spec.data.path", absl::StrCat("no directory '", spec.data().path(),
                                                     "' on the coordinator's machine; install "
                                                     "dataset-fashion-mnist or point it at a copy"));
  }
  struct Expected {
    const char* file;
    size_t dims;
  };
  std::vector<int64_t> counts;
  for (const Expected& expected : {Expected{"train-images-idx3-ubyte.gz", 3}, Expected{"train-labels-idx1-ubyte.gz", 1},
                                   Expected{"t10k-images-idx3-ubyte.gz", 3}, Expected{"t10k-labels-idx1-ubyte.gz", 1}}) {
    const std::string path = (std::filesystem::path(spec.data().path()) / expected.file).string();
    absl::StatusOr<SpecFile> file = SpecFile::Open(path);
    if (absl::IsNotFound(file.status())) {
      return FieldError("spec.data.path", absl::StrCat("'", spec.data().path(), "' has no ", expected.file,
                                                       "; it must hold Fashion-MNIST's four IDX .gz files"));
    }
    if (!file.ok()) return FieldError("spec.data.path", file.status().message());
    (*facts->mutable_versions())[path] = file->version();
    absl::StatusOr<IdxHeader> header = ReadGzippedIdxHeader(*file, path);
    if (!header.ok()) return FieldError("spec.data.path", header.status().message());
    const bool images = expected.dims == 3;
    if (header->type_code != 0x08 || header->dims.size() != expected.dims ||
        (images && (header->dims[1] != 28 || header->dims[2] != 28)) || header->dims[0] < 1) {
      return FieldError("spec.data.path",
                        absl::StrCat("'", path, "' is not Fashion-MNIST's ",
                                     images ? "images (unsigned bytes, N x 28 x 28)" : "labels (unsigned bytes, N)",
                                     ": its IDX header says type 0x", absl::Hex(header->type_code), ", dimensions ",
                                     absl::StrJoin(header->dims, " x ")));
    }
    counts.push_back(header->dims[0]);
  }
  for (size_t split = 0; split < 4; split += 2) {
    if (counts[split] != counts[split + 1]) {
      return FieldError("spec.data.path", absl::StrCat("'", spec.data().path(), "': the ", split == 0 ? "train" : "t10k",
                                                       " images file has ", counts[split], " images and its labels file ",
                                                       counts[split + 1], " labels"));
    }
  }
  facts->set_image_samples(counts[0]);
  return absl::OkStatus();
}

// The worker's test split is the last 10% of the file and needs one window of context + 1 bytes.
absl::Status ValidateTextFile(const JobSpec& spec, int64_t context, SpecFileFacts* facts) {
  absl::StatusOr<SpecFile> file = RequireFile(spec.data().path(), "spec.data.path", "the text file to train on", facts);
  if (!file.ok()) return file.status();
  const int64_t needed = 10 * (context + 1) + 10;
  if (file->size() < needed) {
    return FieldError("spec.data.path", absl::StrCat("'", spec.data().path(), "' has ", file->size(),
                                                     " bytes; a context of ", context, " needs at least ", needed,
                                                     " (its last 10% is the test split)"));
  }
  facts->set_data_bytes(file->size());
  return absl::OkStatus();
}

// Its items size the model's embedding, its users with 3 or more ratings are the samples: counted
// once here, about 0.1 s for MovieLens-1M's million lines.
absl::Status ValidateRatingsFile(const JobSpec& spec, SpecFileFacts* facts) {
  absl::StatusOr<SpecFile> file =
      RequireFile(spec.data().path(), "spec.data.path",
                  "a ratings file in MovieLens-1M format (user::item::rating::timestamp per line), such as "
                  "ml-1m/ratings.dat or one written by tools/make_movielens_sample.py",
                  facts);
  if (!file.ok()) return file.status();
  absl::StatusOr<RatingsCounts> counts = CountRatings(*file, spec.data().path());
  if (!counts.ok()) return FieldError("spec.data.path", counts.status().message());
  if (counts->trainable_users < 1) {
    return FieldError("spec.data.path", absl::StrCat("'", spec.data().path(),
                                                     "' has no user with 3 or more ratings: nothing to train on"));
  }
  facts->set_ratings_items(counts->items);
  facts->set_ratings_trainable_users(counts->trainable_users);
  return absl::OkStatus();
}

// The tensors dataset's test samples: a test file holding every key the training file's way (one sample
// count, the same dtypes and sample shapes), or a fraction of the training file that leaves both sides
// at least one sample.
absl::Status ValidateTensorsTestSplit(const fitrun::v1::DataSpec& data, const std::map<std::string, TensorInfo>& tensors,
                                      const std::vector<std::string>& inputs, const std::string& target, int64_t n) {
  if (!data.test_path().empty()) {
    if (data.has_test_fraction()) {
      return FieldError("spec.data.test_fraction", "give either test_fraction or test_path, not both");
    }
    absl::StatusOr<SpecFile> test_file = SpecFile::Open(data.test_path());
    absl::StatusOr<std::map<std::string, TensorInfo>> test =
        test_file.ok() ? ReadTensorDict(test_file->fd(), static_cast<uint64_t>(test_file->size()))
                       : absl::StatusOr<std::map<std::string, TensorInfo>>(test_file.status());
    if (!test.ok()) {
      return FieldError("spec.data.test_path", absl::StrCat("'", data.test_path(), "': ", test.status().message()));
    }
    std::vector<std::string> wanted = inputs;
    wanted.push_back(target);
    const int64_t test_n = test->count(target) > 0 && !test->at(target).shape.empty() ? test->at(target).shape[0] : -1;
    for (const std::string& key : wanted) {
      const TensorInfo& train = tensors.at(key);
      auto it = test->find(key);
      const bool same = it != test->end() && it->second.dtype == train.dtype && !it->second.shape.empty() &&
                        it->second.shape.size() == train.shape.size() &&
                        std::equal(train.shape.begin() + 1, train.shape.end(), it->second.shape.begin() + 1) &&
                        it->second.shape[0] == test_n;
      if (!same) {
        return FieldError("spec.data.test_path",
                          absl::StrCat("'", data.test_path(), "' must hold '", key, "' like the training file (",
                                       train.Describe(), " there, all with one sample count); it has ",
                                       it == test->end() ? std::string("no such tensor") : it->second.Describe()));
      }
    }
  } else {
    const double fraction = data.has_test_fraction() ? data.test_fraction() : fitrun::contract::data::kDefaultTestFraction;
    if (!(fraction >= 0 && fraction < 1)) {
      return FieldError("spec.data.test_fraction", absl::StrCat("must be in [0, 1) (got ", fraction, ")"));
    }
    const int64_t test_samples = fitrun::contract::data::TestSamples(n, fraction);
    if (test_samples < 1) {
      return FieldError("spec.data.test_fraction",
                        absl::StrCat("holds out no test sample of ", n, "; raise it or give spec.data.test_path"));
    }
    if (n - test_samples < 1) return FieldError("spec.data.test_fraction", absl::StrCat("leaves no training sample of ", n));
  }
  return absl::OkStatus();
}

// The target against the loss (the worker checks the output too, on two samples, before training).
absl::Status ValidateTargetForLoss(const JobSpec& spec, const std::string& target, const TensorInfo& target_info) {
  const fitrun::v1::LossKind loss = spec.loss().kind();
  if ((loss == fitrun::v1::LOSS_KIND_UNSPECIFIED || loss == fitrun::v1::LOSS_KIND_CROSS_ENTROPY) &&
      !target_info.integral()) {
    return FieldError("spec.loss", absl::StrCat("cross_entropy needs integer classes as its target; '", target, "' is ",
                                                target_info.Describe(),
                                                ". For a regression set loss: mse (or l1, smooth_l1)"));
  }
  if ((loss == fitrun::v1::LOSS_KIND_MSE || loss == fitrun::v1::LOSS_KIND_L1 || loss == fitrun::v1::LOSS_KIND_SMOOTH_L1 ||
       loss == fitrun::v1::LOSS_KIND_BCE_WITH_LOGITS) &&
      !target_info.floating()) {
    return FieldError("spec.loss", absl::StrCat(spec.loss().ShortDebugString(), ": needs a floating-point target; '",
                                                target, "' is ", target_info.Describe(),
                                                " (for classes use loss: cross_entropy)"));
  }
  return absl::OkStatus();
}

// A tensors dataset at submit, read with server/core/specs/tensor_file.h: the keys the spec names, one
// sample count, a test split, and a target the spec's loss can compare.
absl::Status ValidateTensorsData(const JobSpec& spec, SpecFileFacts* facts) {
  const fitrun::v1::DataSpec& data = spec.data();
  absl::StatusOr<SpecFile> file = RequireFile(
      data.path(), "spec.data.path", "a file written by torch.save({\"inputs\": x, \"target\": y}, path)", facts);
  if (!file.ok()) return file.status();
  absl::StatusOr<std::map<std::string, TensorInfo>> tensors =
      ReadTensorDict(file->fd(), static_cast<uint64_t>(file->size()));
  if (!tensors.ok()) return FieldError("spec.data.path", absl::StrCat("'", data.path(), "': ", tensors.status().message()));
  std::vector<std::string> found;
  for (const auto& [key, info] : *tensors) found.push_back(absl::StrCat(key, " ", info.Describe()));
  const std::string has = absl::StrCat(" (it has ", absl::StrJoin(found, ", "), ")");
  const std::string target = data.target().empty() ? fitrun::contract::data::kDefaultTargetKey : data.target();
  if (tensors->count(target) == 0) {
    return FieldError(data.target().empty() ? "spec.data.path" : "spec.data.target",
                      absl::StrCat("'", data.path(), "' has no tensor '", target, "'", has,
                                   "; name the target's key in spec.data.target"));
  }
  std::vector<std::string> inputs(data.inputs().begin(), data.inputs().end());
  if (inputs.empty()) {
    for (const auto& [key, info] : *tensors) {
      if (key != target) inputs.push_back(key);
    }
  }
  if (inputs.empty()) return FieldError("spec.data.inputs", absl::StrCat("'", data.path(), "' has no tensor besides the target"));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string field = absl::StrCat("spec.data.inputs[", i, "]");
    if (inputs[i] == target) return FieldError(field, absl::StrCat("'", target, "' is the target"));
    if (tensors->count(inputs[i]) == 0) {
      return FieldError(field, absl::StrCat("'", data.path(), "' has no tensor '", inputs[i], "'", has));
    }
  }
  const TensorInfo& target_info = tensors->at(target);
  for (const auto& [key, info] : *tensors) {
    if (info.shape.empty()) {
      return FieldError("spec.data.path", absl::StrCat("'", data.path(), "': '", key, "' is a scalar; every tensor needs "
                                                                                   "the samples along its first dimension"));
    }
  }
  const int64_t n = target_info.shape[0];
  for (const std::string& key : inputs) {
    if (tensors->at(key).shape[0] != n) {
      return FieldError("spec.data.path", absl::StrCat("'", data.path(), "': '", key, "' is ", tensors->at(key).Describe(),
                                                       " but '", target, "' is ", target_info.Describe(),
                                                       "; every tensor needs the same number of samples along "
                                                       "dimension 0"));
    }
  }
  if (absl::Status s = ValidateTensorsTestSplit(data, *tensors, inputs, target, n); !s.ok()) return s;
  // What plans need of it: every tensor is batched along dimension 0 (checked above).
  facts->set_tensor_samples(n);
  facts->set_tensor_sample_bytes(SampleBytes(*tensors));
  return ValidateTargetForLoss(spec, target, target_info);
}

// spec.loss for a TorchScript model: ignore_index only with cross_entropy.
absl::Status ValidateLoss(const JobSpec& spec) {
  if (spec.loss().has_ignore_index() && spec.loss().kind() != fitrun::v1::LOSS_KIND_CROSS_ENTROPY &&
      spec.loss().kind() != fitrun::v1::LOSS_KIND_UNSPECIFIED) {
    return FieldError("spec.loss.ignore_index", "only for cross_entropy");
  }
  return absl::OkStatus();
}

// ---- the pairs ----------------------------------------------------------------------------------

absl::Status ValidateImageClassifier(const JobSpec& spec, SpecFileFacts* facts) {
  return ValidateFashionMnistDir(spec, facts);
}

absl::Status ValidateGptOnText(const JobSpec& spec, SpecFileFacts* facts) {
  if (absl::Status s = ValidateGptConfig(spec); !s.ok()) return s;
  return ValidateTextFile(spec, spec.model().gpt().context(), facts);
}

absl::Status ValidateSasRecOnRatings(const JobSpec& spec, SpecFileFacts* facts) {
  if (absl::Status s = ValidateSasRecConfig(spec); !s.ok()) return s;
  return ValidateRatingsFile(spec, facts);
}

absl::Status ValidateTorchScriptOnImages(const JobSpec& spec, SpecFileFacts* facts) {
  if (absl::Status s = ValidateTorchScriptFile(spec, facts); !s.ok()) return s;
  const fitrun::v1::LossKind loss = spec.loss().kind();
  if (loss != fitrun::v1::LOSS_KIND_UNSPECIFIED && loss != fitrun::v1::LOSS_KIND_CROSS_ENTROPY &&
      loss != fitrun::v1::LOSS_KIND_MODULE) {
    return FieldError("spec.loss", "a Fashion-MNIST classifier trains with cross_entropy (or its own module loss)");
  }
  if (absl::Status s = ValidateLoss(spec); !s.ok()) return s;
  return ValidateFashionMnistDir(spec, facts);
}

absl::Status ValidateTorchScriptOnTensors(const JobSpec& spec, SpecFileFacts* facts) {
  if (absl::Status s = ValidateTorchScriptFile(spec, facts); !s.ok()) return s;
  if (absl::Status s = ValidateLoss(spec); !s.ok()) return s;
  return ValidateTensorsData(spec, facts);
}

absl::Status ValidateGptOnRatings(const JobSpec& spec, SpecFileFacts* facts) {
  if (absl::Status s = ValidateGptConfig(spec); !s.ok()) return s;
  return ValidateRatingsFile(spec, facts);
}

std::string BuiltinKey(const JobSpec& spec) { return spec.model().builtin(); }
// A config whose activation_checkpointing is false reads as one that leaves it unset: the same
// workload, measured once (and keyed as before the field could be set to false).
template <typename Config>
std::string ConfigKey(Config config) {
  if (config.has_activation_checkpointing() && !config.activation_checkpointing()) config.clear_activation_checkpointing();
  return config.ShortDebugString();
}
std::string GptKey(const JobSpec& spec) { return absl::StrCat("gpt ", ConfigKey(spec.model().gpt())); }
// The item count, read from the ratings file, sizes the embedding.
std::string SasRecKey(const JobSpec& spec) {
  return absl::StrCat("sasrec ", ConfigKey(spec.model().sasrec()), " data ", RecordedVersion(spec, spec.data().path()));
}
std::string TorchScriptKey(const JobSpec& spec) {
  return absl::StrCat("torchscript ", RecordedVersion(spec, spec.model().torchscript()));
}
// The recommender's vocabulary is the ratings file's items.
std::string GptRecommenderKey(const JobSpec& spec) {
  return absl::StrCat(GptKey(spec), " recommender data ", RecordedVersion(spec, spec.data().path()));
}
// The samples' shapes (and so the activations) come from the tensors file; the loss is part of the step.
std::string TorchScriptOnTensorsKey(const JobSpec& spec) {
  return absl::StrCat(TorchScriptKey(spec), " data ", RecordedVersion(spec, spec.data().path()), " ",
                      spec.data().ShortDebugString(), " loss ", spec.loss().ShortDebugString());
}

absl::StatusOr<ModelProfile> Mlp(const JobSpec& spec) { return OnFashionMnist(MlpProfile(), spec); }
absl::StatusOr<ModelProfile> Cnn(const JobSpec& spec) { return OnFashionMnist(CnnProfile(), spec); }
absl::StatusOr<ModelProfile> TorchScriptOnImages(const JobSpec& spec) {
  absl::StatusOr<ModelProfile> profile = TorchScriptProfile(spec);
  if (!profile.ok()) return profile.status();
  return OnFashionMnist(*std::move(profile), spec);
}

}  // namespace

const std::vector<WorkloadKind>& WorkloadKinds() {
  static const auto* kinds = new std::vector<WorkloadKind>{
      // The accuracy bench's 40 workloads (392 batches): analytic 40% to 2431% above the measured peak.
      {"mlp", fitrun::v1::DATA_KIND_FASHION_MNIST, ValidateImageClassifier, Mlp, BuiltinKey, true},
      {"cnn", fitrun::v1::DATA_KIND_FASHION_MNIST, ValidateImageClassifier, Cnn, BuiltinKey, true},
      {"gpt", fitrun::v1::DATA_KIND_TEXT, ValidateGptOnText, GptProfile, GptKey, true},
      {"gpt", fitrun::v1::DATA_KIND_MOVIELENS, ValidateGptOnRatings, GptRecommenderProfile, GptRecommenderKey},
      {"sasrec", fitrun::v1::DATA_KIND_MOVIELENS, ValidateSasRecOnRatings, SasRecProfile, SasRecKey, true},
      {"torchscript", fitrun::v1::DATA_KIND_FASHION_MNIST, ValidateTorchScriptOnImages, TorchScriptOnImages,
       TorchScriptKey},
      {"torchscript", fitrun::v1::DATA_KIND_TENSORS, ValidateTorchScriptOnTensors, TorchScriptOnTensorsProfile,
       TorchScriptOnTensorsKey},
  };
  return *kinds;
}

absl::StatusOr<const WorkloadKind*> FindWorkload(const JobSpec& spec) {
  const fitrun::v1::ModelSpec& model = spec.model();
  if (model.kind_case() == fitrun::v1::ModelSpec::KIND_NOT_SET) {
    return FieldError("spec.model", "required; for example {builtin: mlp} or {torchscript: model.pt}");
  }
  const std::string name = ModelKindName(model);
  // Specs stored before data kinds existed leave Fashion-MNIST's unset (the worker reads them so too).
  const fitrun::v1::DataKind data =
      spec.data().kind() == fitrun::v1::DATA_KIND_UNSPECIFIED ? fitrun::v1::DATA_KIND_FASHION_MNIST : spec.data().kind();
  std::vector<std::string> models;
  std::vector<std::string> data_kinds;
  for (const WorkloadKind& kind : WorkloadKinds()) {
    if (kind.model != "torchscript" && (models.empty() || models.back() != kind.model)) models.push_back(kind.model);
    if (kind.model != name) continue;
    if (kind.data == data) return &kind;
    data_kinds.push_back(DataKindName(kind.data));
  }
  if (data_kinds.empty()) {
    return FieldError("spec.model.builtin",
                      absl::StrCat("unknown model '", name, "'; use one of: ", absl::StrJoin(models, ", ")));
  }
  const std::string who = name == "torchscript" ? std::string("a torchscript model") : absl::StrCat("model ", name);
  return FieldError("spec.data.kind", absl::StrCat(who, " trains on ", absl::StrJoin(data_kinds, " or "),
                                                   " data; set kind: ", data_kinds.front()));
}

absl::Status ValidateModelAndData(const JobSpec& spec, SpecFileFacts* facts) {
  const fitrun::v1::ModelSpec& model = spec.model();
  const bool builtin = model.kind_case() == fitrun::v1::ModelSpec::kBuiltin;
  if (model.has_gpt() && !(builtin && model.builtin() == "gpt")) return FieldError("spec.model.gpt", "only for builtin gpt");
  if (model.has_sasrec() && !(builtin && model.builtin() == "sasrec")) {
    return FieldError("spec.model.sasrec", "only for builtin sasrec");
  }
  if (model.kind_case() != fitrun::v1::ModelSpec::KIND_NOT_SET && spec.data().kind() == fitrun::v1::DATA_KIND_UNSPECIFIED) {
    return FieldError("spec.data.kind", "required; use fashion_mnist, text, movielens or tensors");
  }
  if (spec.has_loss() && builtin) {
    return FieldError("spec.loss", absl::StrCat("only for torchscript models; the builtin ", model.builtin(),
                                                " trains with its own loss"));
  }
  absl::StatusOr<const WorkloadKind*> kind = FindWorkload(spec);
  if (!kind.ok()) return kind.status();
  return (*kind)->validate(spec, facts);
}

absl::StatusOr<ModelProfile> ProfileFor(const JobSpec& spec) {
  if (spec.has_script()) {
    ModelProfile script;
    script.activation_checkpointing = SpecActivationCheckpointing(spec).value_or(false);
    script.memory_unmeasured = true;
    script.memory_source =
        "not measured yet: a script's memory is known only by running it, so its first run is its measurement "
        "(its ranks' peaks in their first steps), and the probe runs it only where that run ran out of memory";
    return script;
  }
  absl::StatusOr<const WorkloadKind*> kind = FindWorkload(spec);
  if (!kind.ok()) return absl::NotFoundError(kind.status().message());
  absl::StatusOr<ModelProfile> profile = (*kind)->profile(spec);
  if (profile.ok() && profile->memory_source.empty()) {
    profile->memory_source = absl::StrCat("analytic: the ", (*kind)->model, " profile's arithmetic");
  }
  return profile;
}

std::string RecordedVersion(const JobSpec& spec, const std::string& path) {
  auto version = spec.file_facts().versions().find(path);
  return version != spec.file_facts().versions().end() ? version->second : absl::StrCat(path, "@unread");
}

bool AnalyticEstimateIsUpperBound(const JobSpec& spec) {
  if (spec.has_script()) return false;
  absl::StatusOr<const WorkloadKind*> kind = FindWorkload(spec);
  return kind.ok() && (*kind)->analytic_is_upper_bound;
}

bool CanCheckpointActivations(const JobSpec& spec) {
  if (spec.has_script()) return spec.script().applies_strategy();
  const fitrun::v1::ModelSpec& model = spec.model();
  return model.kind_case() == fitrun::v1::ModelSpec::kBuiltin &&
         (model.builtin() == "gpt" || model.builtin() == "sasrec");
}

std::optional<bool> SpecActivationCheckpointing(const JobSpec& spec) {
  if (!CanCheckpointActivations(spec)) return false;
  if (spec.has_script()) {
    if (spec.script().has_activation_checkpointing()) return spec.script().activation_checkpointing();
    return std::nullopt;
  }
  const fitrun::v1::ModelSpec& model = spec.model();
  if (model.builtin() == "gpt" && model.gpt().has_activation_checkpointing()) return model.gpt().activation_checkpointing();
  if (model.builtin() == "sasrec" && model.sasrec().has_activation_checkpointing()) {
    return model.sasrec().activation_checkpointing();
  }
  return std::nullopt;
}

JobSpec WithActivationCheckpointing(JobSpec spec, bool on) {
  if (!CanCheckpointActivations(spec)) return spec;
  if (spec.has_script()) spec.mutable_script()->set_activation_checkpointing(on);
  if (spec.model().builtin() == "gpt") spec.mutable_model()->mutable_gpt()->set_activation_checkpointing(on);
  if (spec.model().builtin() == "sasrec") spec.mutable_model()->mutable_sasrec()->set_activation_checkpointing(on);
  return spec;
}

JobSpec SpecAsPlanned(const JobSpec& spec, const fitrun::v1::Plan& plan) {
  return CanCheckpointActivations(spec) ? WithActivationCheckpointing(spec, plan.activation_checkpointing()) : spec;
}

std::string WorkloadMemoryKey(const JobSpec& spec) {
  absl::StatusOr<const WorkloadKind*> kind = FindWorkload(spec);
  if (kind.ok()) return (*kind)->memory_key(spec);
  // A spec that names no valid pair still gets a key that follows its model's config.
  for (const WorkloadKind& k : WorkloadKinds()) {
    if (k.model == ModelKindName(spec.model())) return k.memory_key(spec);
  }
  return ModelKindName(spec.model());
}

}  // namespace fitrun::server
