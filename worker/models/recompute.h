#ifndef FITRUN_WORKER_MODELS_RECOMPUTE_H_
#define FITRUN_WORKER_MODELS_RECOMPUTE_H_

#include <ATen/core/Tensor.h>

#include <functional>

namespace fitrun::worker {

// A part of a model whose activations are not kept: `block(input)` runs without recording what
// backward needs, only `input` is saved, and backward runs the block again on it with gradients on and
// goes back through that (PyTorch's torch.utils.checkpoint in its reentrant form). Trades one more
// forward of the block for its activations. Exact for a deterministic block (no dropout): the second
// run computes the same values. Parameters get their gradients through autograd's accumulators as in
// a plain backward, so the DDP reducer's hooks see each once. `block` must outlive the backward.
// An input that needs no gradient (or gradients off) runs the block plainly: autograd would otherwise
// never call the recomputing backward, and the block's parameters would get no gradients.
at::Tensor RecomputedInBackward(std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& input);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_RECOMPUTE_H_
