// One training step of a model with every allocation counted: what the activation-checkpointing tests
// compare between a model that keeps its blocks' activations and one that recomputes them.
#ifndef FITRUN_WORKER_MODELS_MEASURED_STEP_TESTING_H_
#define FITRUN_WORKER_MODELS_MEASURED_STEP_TESTING_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "gtest/gtest.h"
#include "worker/memory/capped_allocator.h"
#include "worker/models/model.h"

namespace fitrun::worker {

struct MeasuredStep {
  double loss = 0;
  std::vector<at::Tensor> gradients;  // every parameter's, in order
  int64_t peak_bytes = 0;             // the most bytes live during forward and backward
};

inline MeasuredStep TrainOneStepCounted(Model& model, const ModelInputs& inputs, const at::Tensor& targets) {
  CappedCpuAllocator counting(/*cap_bytes=*/0);
  counting.Install();
  MeasuredStep step;
  {
    at::Tensor loss = model.Loss(inputs, targets);
    step.loss = loss.item<double>();
    loss.backward();
  }
  step.peak_bytes = counting.Peak();
  counting.Uninstall();
  for (const at::Tensor& p : model.parameters()) step.gradients.push_back(p.grad().clone());
  return step;
}

// A recomputed step must be the kept one's numbers: the same loss and every gradient bit for bit.
// Prints both peaks, which each test holds to its own bound.
inline void ExpectSameNumbers(const MeasuredStep& plain, const MeasuredStep& recomputed) {
  EXPECT_EQ(recomputed.loss, plain.loss);
  ASSERT_EQ(recomputed.gradients.size(), plain.gradients.size());
  for (size_t i = 0; i < plain.gradients.size(); ++i) {
    EXPECT_TRUE(at::equal(recomputed.gradients[i], plain.gradients[i])) << "parameter " << i;
  }
  std::printf("one step's peak: plain %lld bytes, checkpointed %lld bytes\n", static_cast<long long>(plain.peak_bytes),
              static_cast<long long>(recomputed.peak_bytes));
}

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_MEASURED_STEP_TESTING_H_
