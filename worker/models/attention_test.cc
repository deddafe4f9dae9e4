#include "worker/models/attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace fitrun::worker {
namespace {

// Causal attention written out, as the worker computed it before LibTorch had a kernel for it.
at::Tensor WrittenOut(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads) {
  const int64_t batch = q.size(0), time = q.size(1), hidden = q.size(2), head_dim = hidden / heads;
  auto split = [&](const at::Tensor& x) { return x.view({batch, time, heads, head_dim}).transpose(1, 2); };
  at::Tensor scores = at::matmul(split(q), split(k).transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  scores = scores.masked_fill(at::ones({time, time}, at::kBool).triu(1), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), split(v)).transpose(1, 2).contiguous().view({batch, time, hidden});
}

TEST(AttentionTest, MatchesTheSumWrittenOutInValuesAndGradients) {
  at::manual_seed(3);
  const at::Tensor q = at::randn({3, 17, 32}).requires_grad_();
  const at::Tensor k = at::randn({3, 17, 32}).requires_grad_();
  const at::Tensor v = at::randn({3, 17, 32}).requires_grad_();
  const at::Tensor weights = at::randn({3, 17, 32});
  const at::Tensor ours = CausalAttention(q, k, v, 4);
  const at::Tensor reference = WrittenOut(q, k, v, 4);
  EXPECT_TRUE(at::allclose(ours, reference, 1e-5, 1e-6)) << (ours - reference).abs().max();
  const std::vector<at::Tensor> our_grads = torch::autograd::grad({(ours * weights).sum()}, {q, k, v});
  const std::vector<at::Tensor> reference_grads = torch::autograd::grad({(reference * weights).sum()}, {q, k, v});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::allclose(our_grads[i], reference_grads[i], 1e-4, 1e-5))
        << i << ": " << (our_grads[i] - reference_grads[i]).abs().max();
  }
}

TEST(AttentionTest, APositionSeesNoFuturePosition) {
  at::manual_seed(4);
  const at::Tensor q = at::randn({1, 9, 16});
  const at::Tensor k = at::randn({1, 9, 16});
  at::Tensor v = at::randn({1, 9, 16});
  const at::Tensor before = CausalAttention(q, k, v, 2);
  v[0][8].add_(10.0);  // only the last position's value changes
  const at::Tensor after = CausalAttention(q, k, v, 2);
  EXPECT_TRUE(at::allclose(before.narrow(1, 0, 8), after.narrow(1, 0, 8), 0, 1e-6));
  EXPECT_FALSE(at::allclose(before.narrow(1, 8, 1), after.narrow(1, 8, 1)));
}

}  // namespace
}  // namespace fitrun::worker
