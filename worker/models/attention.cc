#include "worker/models/attention.h"

#include <ATen/ATen.h>

#include "worker/torch_compat.h"

namespace fitrun::worker {

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  const int64_t batch = q.size(0);
  const int64_t time = q.size(1);
  const int64_t hidden = q.size(2);
  const int64_t head_dim = hidden / heads;
  auto split = [&](const at::Tensor& x) {
    return x.view({batch, time, heads, head_dim}).transpose(1, 2);  // [B, heads, T, head_dim]
  };
  const at::Tensor mixed = torch_compat::ScaledDotProductCausalAttention(split(q), split(k), split(v));
  return mixed.transpose(1, 2).contiguous().view({batch, time, hidden});
}

}  // namespace fitrun::worker
