#ifndef FITRUN_WORKER_DATA_EXAMPLES_H_
#define FITRUN_WORKER_DATA_EXAMPLES_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fitrun::worker {

// A dataset held in memory as two row-aligned tensors that the trainer batches with index_select on
// dimension 0. For Fashion-MNIST: images [N, 1, 28, 28] float32, normalized, and labels [N] int64.
// Other workloads keep their own inputs and targets in the same two fields (text: byte windows
// [N, context] and the same windows shifted by one; ratings: item sequences and next items) and
// their model knows how to read them (Model::Loss, Model::Evaluate).
struct LabeledImages {
  at::Tensor images;
  at::Tensor labels;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

enum class Split { kTrain, kTest };

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_EXAMPLES_H_
