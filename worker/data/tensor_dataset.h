#ifndef FITRUN_WORKER_DATA_TENSOR_DATASET_H_
#define FITRUN_WORKER_DATA_TENSOR_DATASET_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace fitrun::worker {

// A dataset held in memory as row-aligned tensors that the trainer batches along dimension 0: the
// model's inputs, in the order its forward takes them, and the targets its loss compares the output
// with. Fashion-MNIST: images [N, 1, 28, 28] float32 (normalized) and classes [N] int64; text: byte
// windows [N, context] and the same windows shifted by one (worker/data/text.h); ratings: item
// sequences and next items (worker/data/movielens.h); a tensors file: its named tensors, in the
// spec's order (worker/data/tensors.h).
struct TensorDataset {
  std::vector<at::Tensor> inputs;
  at::Tensor targets;

  int64_t size() const { return targets.defined() ? targets.size(0) : 0; }
  // Rows [begin, begin + n) of every tensor, as views.
  TensorDataset Slice(int64_t begin, int64_t n) const {
    TensorDataset out;
    for (const at::Tensor& input : inputs) out.inputs.push_back(input.narrow(0, begin, n));
    out.targets = targets.narrow(0, begin, n);
    return out;
  }
  // Every tensor on `device` (the same tensors when they are there already).
  TensorDataset To(const c10::Device& device) const {
    TensorDataset out;
    for (const at::Tensor& input : inputs) out.inputs.push_back(input.to(device));
    out.targets = targets.to(device);
    return out;
  }
};

enum class Split { kTrain, kTest };

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_TENSOR_DATASET_H_
