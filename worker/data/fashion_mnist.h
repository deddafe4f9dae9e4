#ifndef FITRUN_WORKER_DATA_FASHION_MNIST_H_
#define FITRUN_WORKER_DATA_FASHION_MNIST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset_cache.h"
#include "worker/data/tensor_dataset.h"

namespace fitrun::worker {

// The training set's per-pixel mean and standard deviation (after scaling to [0, 1]); images are
// normalized with them so the builtin models train at the learning rates people use for MNIST.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Loads one split of Fashion-MNIST from `dir`, which holds the four IDX .gz files
// (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,
// t10k-labels-idx1-ubyte.gz). Image and label counts must agree and images must be 28x28. With a
// `cache`, each file is decompressed only when the cache holds no valid copy of it (and the copy is
// written for the next rank); the tensors are bit-identical either way.
absl::StatusOr<TensorDataset> LoadFashionMnist(const std::string& dir, Split split, DatasetCache* cache = nullptr);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_FASHION_MNIST_H_
