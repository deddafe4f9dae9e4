#include "worker/data/tensors.h"

#include <torch/serialize.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/contract/data_contract.h"

namespace fitrun::worker {
namespace {

namespace data_contract = ::fitrun::contract::data;

absl::Status Refuse(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

std::string Describe(const at::Tensor& t) {
  return absl::StrCat(c10::toString(t.scalar_type()), " [", absl::StrJoin(t.sizes(), ", "), "]");
}

std::string TargetKey(const fitrun::v1::DataSpec& data) {
  return data.target().empty() ? data_contract::kDefaultTargetKey : data.target();
}

// The file's tensors by key, or why it is not a dict of tensors.
absl::StatusOr<std::map<std::string, at::Tensor>> ReadDict(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Refuse(field, absl::StrCat("cannot read '", path, "'"));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    return Refuse(field, absl::StrCat("'", path, "' is not a file torch.save wrote: ", e.what()));
  }
  if (!value.isGenericDict()) {
    return Refuse(field, absl::StrCat("'", path, "' holds a ", value.tagKind(),
                                      ", not a dict of tensors; save one with torch.save({\"inputs\": x, \"target\": y}, path)"));
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) return Refuse(field, absl::StrCat("'", path, "' has a key that is not a string"));
    const std::string key = entry.key().toStringRef();
    if (!entry.value().isTensor()) {
      return Refuse(field, absl::StrCat("'", path, "': '", key, "' is a ", entry.value().tagKind(), ", not a tensor"));
    }
    const at::Tensor tensor = entry.value().toTensor();
    if (tensor.dim() < 1) {
      return Refuse(field, absl::StrCat("'", path, "': '", key, "' is a scalar; every tensor needs the samples along "
                                                              "its first dimension"));
    }
    out[key] = tensor.contiguous();
  }
  if (out.empty()) return Refuse(field, absl::StrCat("'", path, "' holds an empty dict"));
  return out;
}

}  // namespace

std::vector<std::string> TensorInputKeys(const fitrun::v1::DataSpec& data, const std::vector<std::string>& keys) {
  if (!data.inputs().empty()) return {data.inputs().begin(), data.inputs().end()};
  const std::string target = TargetKey(data);
  std::vector<std::string> inputs;
  for (const std::string& key : keys) {
    if (key != target) inputs.push_back(key);
  }
  std::sort(inputs.begin(), inputs.end());
  return inputs;
}

absl::StatusOr<TensorDataset> LoadTensors(const fitrun::v1::DataSpec& data, Split split) {
  absl::StatusOr<std::map<std::string, at::Tensor>> all = ReadDict(data.path(), "spec.data.path");
  if (!all.ok()) return all.status();
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : *all) keys.push_back(key);
  const std::string target = TargetKey(data);
  if (all->count(target) == 0) {
    return Refuse(data.target().empty() ? "spec.data.path" : "spec.data.target",
                  absl::StrCat("'", data.path(), "' has no tensor '", target, "' (it has ", absl::StrJoin(keys, ", "),
                               "); name the target's key in spec.data.target"));
  }
  const std::vector<std::string> input_keys = TensorInputKeys(data, keys);
  if (input_keys.empty()) return Refuse("spec.data.inputs", absl::StrCat("'", data.path(), "' has no tensor besides the target"));
  for (size_t i = 0; i < input_keys.size(); ++i) {
    if (all->count(input_keys[i]) == 0) {
      return Refuse(absl::StrCat("spec.data.inputs[", i, "]"),
                    absl::StrCat("'", data.path(), "' has no tensor '", input_keys[i], "' (it has ",
                                 absl::StrJoin(keys, ", "), ")"));
    }
    if (input_keys[i] == target) {
      return Refuse(absl::StrCat("spec.data.inputs[", i, "]"), absl::StrCat("'", target, "' is the target"));
    }
  }
  const int64_t n = all->at(target).size(0);
  for (const std::string& key : input_keys) {
    if (all->at(key).size(0) != n) {
      return Refuse("spec.data.path", absl::StrCat("'", data.path(), "': '", key, "' is ", Describe(all->at(key)), " but '",
                                                   target, "' is ", Describe(all->at(target)),
                                                   "; every tensor needs the same number of samples along dimension 0"));
    }
  }
  TensorDataset whole;
  for (const std::string& key : input_keys) whole.inputs.push_back(all->at(key));
  whole.targets = all->at(target);

  if (!data.test_path().empty()) {
    if (split == Split::kTrain) return whole;
    absl::StatusOr<std::map<std::string, at::Tensor>> test = ReadDict(data.test_path(), "spec.data.test_path");
    if (!test.ok()) return test.status();
    TensorDataset out;
    std::vector<std::string> wanted = input_keys;
    wanted.push_back(target);
    const int64_t test_n = test->count(target) > 0 ? test->at(target).size(0) : -1;
    for (const std::string& key : wanted) {
      auto it = test->find(key);
      const at::Tensor& train_tensor = all->at(key);
      if (it == test->end() || it->second.scalar_type() != train_tensor.scalar_type() ||
          it->second.sizes().slice(1) != train_tensor.sizes().slice(1) || it->second.size(0) != test_n) {
        return Refuse("spec.data.test_path",
                      absl::StrCat("'", data.test_path(), "' must hold '", key, "' like the training file (",
                                   Describe(train_tensor), " there, all with one sample count); it has ",
                                   it == test->end() ? "no such tensor" : Describe(it->second)));
      }
      if (key == target) {
        out.targets = it->second;
      } else {
        out.inputs.push_back(it->second);
      }
    }
    return out;
  }
  const double fraction = data.has_test_fraction() ? data.test_fraction() : data_contract::kDefaultTestFraction;
  const int64_t test_samples = data_contract::TestSamples(n, fraction);
  if (n - test_samples < 1) {
    return Refuse("spec.data.test_fraction", absl::StrCat("leaves no training sample of ", n));
  }
  if (split == Split::kTrain) return whole.Slice(0, n - test_samples);
  if (test_samples < 1) {
    return Refuse("spec.data.test_fraction",
                  absl::StrCat("holds out no test sample of ", n, "; raise it or give spec.data.test_path"));
  }
  return whole.Slice(n - test_samples, test_samples);
}

}  // namespace fitrun::worker
