#ifndef FITRUN_WORKER_MODELS_ATTENTION_H_
#define FITRUN_WORKER_MODELS_ATTENTION_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fitrun::worker {

// Multi-head causal attention from already projected queries, keys and values, each [B, T, H]:
// position t attends to positions <= t only. LibTorch 2.x's scaled_dot_product_attention (flash
// attention on a GPU, in bf16 under autocast), plain ops on 1.13, which has none
// (torch_compat::ScaledDotProductCausalAttention). Returns [B, T, H], heads concatenated (before any
// output projection). `heads` must divide H.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_ATTENTION_H_
