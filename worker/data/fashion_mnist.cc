#include "worker/data/fashion_mnist.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstring>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/idx.h"

namespace fitrun::worker {
namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;
// Pixels per at::parallel_for task when a rank has more than one thread.
constexpr int64_t kPixelsPerTask = int64_t{1} << 20;

// The normalized value of each of the 256 pixel bytes, computed by the very ops (so with the same
// float rounding) that would normalize a whole image tensor: to(kFloat).div_(255).sub_(mean)
// .div_(std). Looking pixels up in it is one pass instead of four, with bit-identical values, which
// the parity tests against PyTorch depend on.
const std::array<float, 256>& NormalizedPixels() {
  static const std::array<float, 256> table = [] {
    std::array<uint8_t, 256> bytes;
    std::iota(bytes.begin(), bytes.end(), 0);
    const at::Tensor values = at::from_blob(bytes.data(), {256}, at::kByte)
                                  .to(at::kFloat)
                                  .div_(255.0f)
                                  .sub_(kFashionMnistMean)
                                  .div_(kFashionMnistStd)
                                  .contiguous();
    std::array<float, 256> normalized;
    std::memcpy(normalized.data(), values.data_ptr<float>(), sizeof(normalized));
    return normalized;
  }();
  return table;
}

// Images [n, 1, 28, 28] as float32, normalized.
at::Tensor NormalizedImages(absl::Span<const uint8_t> pixels, int64_t n) {
  const std::array<float, 256>& table = NormalizedPixels();
  at::Tensor images = at::empty({n, 1, kSide, kSide}, at::kFloat);
  float* out = images.data_ptr<float>();
  const uint8_t* in = pixels.data();
  at::parallel_for(0, images.numel(), kPixelsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = table[in[i]];
  });
  return images;
}

}  // namespace

absl::StatusOr<TensorDataset> LoadFashionMnist(const std::string& dir, Split split, DatasetCache* cache) {
  const std::string prefix = absl::StrCat(dir, "/", split == Split::kTrain ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";

  DatasetCache no_cache(DatasetCache::Options{});
  DatasetCache& reader = cache != nullptr ? *cache : no_cache;
  absl::StatusOr<IdxData> images = reader.ReadIdx(images_path, 3);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxData> labels = reader.ReadIdx(labels_path, 1);
  if (!labels.ok()) return labels.status();

  if (images->dims()[1] != kSide || images->dims()[2] != kSide) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": images are ", images->dims()[1], "x",
                                                   images->dims()[2], ", expected 28x28"));
  }
  const int64_t n = images->dims()[0];
  if (labels->dims()[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " has ", n, " images but ", labels_path,
                                                   " has ", labels->dims()[0], " labels"));
  }
  TensorDataset set;
  set.targets = at::empty({n}, at::kLong);
  int64_t* targets = set.targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t label = labels->bytes()[i];
    if (label >= kClasses) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{label}, " at index ", i,
                                                     " is not a class in [0, 10)"));
    }
    targets[i] = label;
  }
  set.inputs = {NormalizedImages(images->bytes(), n)};
  return set;
}

}  // namespace fitrun::worker
