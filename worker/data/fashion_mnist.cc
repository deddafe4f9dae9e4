#include "worker/data/fashion_mnist.h"

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/idx.h"

namespace fitrun::worker {
namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;

}  // namespace

absl::StatusOr<TensorDataset> LoadFashionMnist(const std::string& dir, Split split) {
  const std::string prefix = absl::StrCat(dir, "/", split == Split::kTrain ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";

  absl::StatusOr<IdxArray> images = ReadIdxFile(images_path, 3);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadIdxFile(labels_path, 1);
  if (!labels.ok()) return labels.status();

  if (images->dims[1] != kSide || images->dims[2] != kSide) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": images are ", images->dims[1], "x",
                                                   images->dims[2], ", expected 28x28"));
  }
  const int64_t n = images->dims[0];
  if (labels->dims[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " has ", n, " images but ", labels_path,
                                                   " has ", labels->dims[0], " labels"));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (labels->data[i] >= kClasses) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{labels->data[i]},
                                                     " at index ", i, " is not a class in [0, 10)"));
    }
  }

  // from_blob borrows the vectors, so each tensor is converted (copied) before they go away.
  TensorDataset set;
  set.inputs = {at::from_blob(images->data.data(), {n, 1, kSide, kSide}, at::kByte)
                    .to(at::kFloat)
                    .div_(255.0f)
                    .sub_(kFashionMnistMean)
                    .div_(kFashionMnistStd)};
  set.targets = at::from_blob(labels->data.data(), {n}, at::kByte).to(at::kLong);
  return set;
}

}  // namespace fitrun::worker
