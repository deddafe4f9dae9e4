#include "worker/models/attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace fitrun::worker {

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  const int64_t batch = q.size(0);
  const int64_t time = q.size(1);
  const int64_t hidden = q.size(2);
  const int64_t head_dim = hidden / heads;
  auto split = [&](const at::Tensor& x) {
    return x.view({batch, time, heads, head_dim}).transpose(1, 2);  // [B, heads, T, head_dim]
  };
  at::Tensor scores = at::matmul(split(q), split(k).transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  // Built per call rather than kept as a buffer: a bool buffer would be broadcast and checksummed
  // with the parameters, and it is cheap next to the matmuls.
  const at::Tensor future = at::ones({time, time}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const at::Tensor mixed = at::matmul(at::softmax(scores, -1), split(v));
  return mixed.transpose(1, 2).contiguous().view({batch, time, hidden});
}

}  // namespace fitrun::worker
