// What the training-loop tests train on: a synthetic Fashion-MNIST-shaped set that an mlp learns in a
// few steps, the built-in mlp from a seed, and how far two models' parameters are apart.
#ifndef FITRUN_WORKER_TRAINER_TRAINER_TESTING_H_
#define FITRUN_WORKER_TRAINER_TRAINER_TESTING_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/tensor_dataset.h"
#include "worker/models/model.h"

namespace fitrun::worker {

// `n` 28x28 images in 10 classes, each class marked by two brighter rows; the same for the same seed.
inline TensorDataset SyntheticSet(int64_t n, uint64_t seed = 11) {
  at::manual_seed(seed);
  TensorDataset set;
  set.targets = at::arange(n, at::kLong).remainder(10);
  set.inputs = {at::randn({n, 1, 28, 28}) * 0.5};
  for (int64_t i = 0; i < n; ++i) set.inputs[0][i][0].narrow(0, 2 * (i % 10), 2).add_(2.0);
  return set;
}

inline std::shared_ptr<Model> MlpFromSeed(uint64_t seed) {
  fitrun::v1::ModelSpec spec;
  spec.set_builtin("mlp");
  auto model = CreateModel(spec, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

// The largest absolute difference between two models' corresponding parameters.
inline double MaxAbsDifference(const torch::nn::Module& a, const torch::nn::Module& b) {
  const std::vector<at::Tensor> pa = a.parameters();
  const std::vector<at::Tensor> pb = b.parameters();
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (size_t i = 0; i < pa.size() && i < pb.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_TRAINER_TESTING_H_
