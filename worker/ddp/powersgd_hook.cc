#include "worker/ddp/powersgd_hook.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fitrun::worker {
namespace {

// PowerSGDState draws the seed of each bucket's first Qs as randint(1_000_000_000).
constexpr int64_t kSeedBound = 1'000'000'000;

c10::intrusive_ptr<c10d::Work> AllReduce(c10d::ProcessGroup& group, const at::Tensor& tensor) {
  std::vector<at::Tensor> tensors = {tensor};
  return group.allreduce(tensors);
}

// _orthogonalize_gram_schmidt.
void OrthogonalizeGramSchmidt(const at::Tensor& matrices, double epsilon) {
  const int64_t columns = matrices.size(2);
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrices.narrow(2, i, 1);
    // torch.norm(col, dim=1, keepdim=True) is the Frobenius norm over dim 1. With epsilon 0 a
    // column of zeros becomes NaNs, as in PyTorch (its ZeroDivisionError guard never fires on
    // tensors).
    if (epsilon == 0) {
      column.div_(at::frobenius_norm(column, {1}, /*keepdim=*/true));
    } else {
      column.div_(at::frobenius_norm(column, {1}, /*keepdim=*/true) + epsilon);
    }
    if (i + 1 < columns) {
      at::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, {1}, /*keepdim=*/true) * column);
    }
  }
}

}  // namespace

void Orthogonalize(const at::Tensor& matrices, double epsilon) {
  const int64_t rank = matrices.size(2);
  const at::ScalarType dtype = matrices.scalar_type();
  if (rank <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    OrthogonalizeGramSchmidt(matrices, epsilon);
    return;
  }
  // torch.linalg.qr(matrices, out=(matrices, R)).
  at::Tensor q = matrices;
  at::Tensor r = at::empty({matrices.size(0), rank, rank}, matrices.options());
  at::linalg_qr_out(q, r, matrices, "reduced");
}

absl::StatusOr<std::unique_ptr<PowerSgdHook>> PowerSgdHook::Create(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                                   const PowerSgdOptions& options) {
  if (options.matrix_approximation_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.ddp.powersgd_rank: must be >= 1 (got ", options.matrix_approximation_rank, ")"));
  }
  if ((options.use_error_feedback || options.warm_start) && options.start_powersgd_iter <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.ddp.powersgd_start_iter: must be >= 2 with error feedback and warm start (got ",
                     options.start_powersgd_iter, ")"));
  }
  return std::unique_ptr<PowerSgdHook>(new PowerSgdHook(std::move(group), options));
}

PendingReduction PowerSgdHook::Start(const GradBucket& bucket) {
  const int64_t world = group_->getSize();
  if (iter_ < options_.start_powersgd_iter) {
    if (bucket.is_last) ++iter_;
    bucket.flat.div_(world);
    return PendingReduction({AllReduce(*group_, bucket.flat)}, nullptr);
  }

  const at::Tensor& input = bucket.buffer;
  BucketState& state = buckets_[bucket.index];
  if (options_.use_error_feedback) {
    if (state.error.defined()) {
      input.add_(state.error);
    } else {
      state.error = at::zeros({input.numel()}, input.options());
    }
    state.input_copy = input.clone();
  }

  // Step I: which gradients are worth compressing.
  const int64_t rank_limit = options_.matrix_approximation_rank;
  std::vector<at::Tensor> to_compress;  // [n, m] views of the bucket
  std::vector<at::Tensor> uncompressed;
  int64_t total_p = 0;
  int64_t total_q = 0;
  for (const at::Tensor& tensor : bucket.gradients) {
    // A 0-d gradient is a 1 x 1 matrix, never compressed (PyTorch's tensor.shape[0] would raise).
    const int64_t n = tensor.dim() > 0 ? tensor.size(0) : 1;
    const int64_t m = n > 0 ? tensor.numel() / n : 0;
    const int64_t rank = std::min({n, m, rank_limit});
    const int64_t uncompressed_size = n * m;
    const int64_t compressed_size = (n + m) * rank;
    numel_before_ += uncompressed_size;
    if (static_cast<double>(compressed_size) * options_.min_compression_rate < static_cast<double>(uncompressed_size)) {
      to_compress.push_back(tensor.view({n, m}));
      total_p += n * rank;
      total_q += m * rank;
      numel_after_ += compressed_size;
    } else {
      uncompressed.push_back(tensor);
      numel_after_ += uncompressed_size;
    }
  }

  // Step II: the uncompressed gradients, and the exact elements, in one contiguous all-reduce.
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& tensor : uncompressed) pieces.push_back(tensor.reshape({-1}));
  if (bucket.exact.numel() > 0) pieces.push_back(bucket.exact);
  const at::Tensor uncompressed_memory = pieces.empty() ? at::empty({0}, input.options()) : at::cat(pieces);

  // Step III: P and Q memory, kept across steps for warm start.
  bool randomize_qs = false;
  if (!options_.warm_start || !state.p_memory.defined()) {
    randomize_qs = true;
    state.p_memory = at::empty({total_p}, input.options());
    state.q_memory = at::empty({total_q}, input.options());
  }
  // Matrices grouped by shape in order of first appearance (PyTorch's shape_to_tensors dict).
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> by_shape;
  for (const at::Tensor& matrix : to_compress) {
    const std::vector<int64_t> shape = matrix.sizes().vec();
    auto group = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& g) { return g.first == shape; });
    if (group == by_shape.end()) {
      by_shape.emplace_back(shape, std::vector<at::Tensor>{matrix});
    } else {
      group->second.push_back(matrix);
    }
  }
  std::vector<at::Tensor> matrices;  // [1, n, m]
  std::vector<at::Tensor> ps;        // [1, n, r] views of p_memory
  std::vector<at::Tensor> qs;        // [1, m, r] views of q_memory
  int64_t p_offset = 0;
  int64_t q_offset = 0;
  for (const auto& [shape, group] : by_shape) {
    for (const at::Tensor& matrix : group) {
      const int64_t n = shape[0];
      const int64_t m = shape[1];
      const int64_t rank = std::min({n, m, rank_limit});
      matrices.push_back(matrix.unsqueeze(0));
      ps.push_back(state.p_memory.narrow(0, p_offset, n * rank).view({1, n, rank}));
      qs.push_back(state.q_memory.narrow(0, q_offset, m * rank).view({1, m, rank}));
      p_offset += n * rank;
      q_offset += m * rank;
    }
  }

  if (!randomize_qs) {
    for (const at::Tensor& q : qs) Orthogonalize(q, options_.orthogonalization_epsilon);
  } else {
    // torch.manual_seed(rng.randint(1e9)) in a forked CPU generator, then torch.randn on CPU.
    at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(rng_.RandInt(kSeedBound)));
    for (const at::Tensor& q : qs) {
      q.copy_(at::randn(q.sizes(), generator, at::TensorOptions().dtype(q.scalar_type()).device(at::kCPU)));
      Orthogonalize(q, options_.orthogonalization_epsilon);
    }
  }
  for (size_t i = 0; i < matrices.size(); ++i) {
    at::Tensor p = ps[i];
    at::bmm_out(p, matrices[i], qs[i]);
  }

  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  if (uncompressed_memory.numel() > 0) works.push_back(AllReduce(*group_, uncompressed_memory));
  // Ps are orthogonalized after the sum, so they are not divided by the world size.
  if (state.p_memory.numel() > 0) works.push_back(AllReduce(*group_, state.p_memory));

  return PendingReduction(std::move(works), [this, &state, world, bucket, uncompressed_memory, uncompressed,
                                             matrices, ps, qs] {
    if (uncompressed_memory.numel() > 0) {
      uncompressed_memory.div_(world);
      int64_t offset = 0;
      for (const at::Tensor& tensor : uncompressed) {
        tensor.copy_(uncompressed_memory.narrow(0, offset, tensor.numel()).view_as(tensor));
        offset += tensor.numel();
      }
      if (bucket.exact.numel() > 0) bucket.exact.copy_(uncompressed_memory.narrow(0, offset, bucket.exact.numel()));
    }
    for (const at::Tensor& p : ps) Orthogonalize(p, options_.orthogonalization_epsilon);
    for (size_t i = 0; i < matrices.size(); ++i) {
      at::Tensor q = qs[i];
      at::bmm_out(q, matrices[i].transpose(1, 2), ps[i]);
    }
    if (state.q_memory.numel() > 0) AllReduce(*group_, state.q_memory)->wait();
    state.q_memory.div_(world);
    for (size_t i = 0; i < matrices.size(); ++i) {
      at::Tensor m = matrices[i];
      at::bmm_out(m, ps[i], qs[i].transpose(1, 2));
    }
    if (options_.use_error_feedback) at::sub_out(state.error, state.input_copy, bucket.buffer);
    if (!options_.warm_start) {
      state.p_memory = at::Tensor();
      state.q_memory = at::Tensor();
    }
    if (bucket.is_last) ++iter_;
  });
}

std::string PowerSgdHook::Describe() const {
  std::string text = absl::StrCat("powersgd (rank ", options_.matrix_approximation_rank, ", compressing from step ",
                                  options_.start_powersgd_iter + 1);
  if (numel_after_ > 0) {
    const double rate = static_cast<double>(numel_before_) / static_cast<double>(numel_after_);
    absl::StrAppend(&text, "; ", numel_before_, " elements compressed to ", numel_after_, ", ",
                    std::round(rate * 10) / 10, "x");
  }
  return text + ")";
}

}  // namespace fitrun::worker
