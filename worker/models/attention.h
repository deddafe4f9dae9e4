#ifndef FITRUN_WORKER_MODELS_ATTENTION_H_
#define FITRUN_WORKER_MODELS_ATTENTION_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fitrun::worker {

// Multi-head causal attention from already projected queries, keys and values, each [B, T, H]:
// position t attends to positions <= t only. Written with plain ops because LibTorch 1.13 has no
// scaled_dot_product_attention. Returns [B, T, H], heads concatenated (before any output
// projection). `heads` must divide H.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_ATTENTION_H_
