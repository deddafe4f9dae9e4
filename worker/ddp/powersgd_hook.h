#ifndef FITRUN_WORKER_DDP_POWERSGD_HOOK_H_
#define FITRUN_WORKER_DDP_POWERSGD_HOOK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/numpy_random.h"

namespace fitrun::worker {

// PyTorch's PowerSGDState hyperparameters, with its defaults (batch_tensors_with_same_shape off).
struct PowerSgdOptions {
  int matrix_approximation_rank = 1;
  int64_t start_powersgd_iter = 1000;
  double min_compression_rate = 2;
  double orthogonalization_epsilon = 0;
  bool use_error_feedback = true;
  bool warm_start = true;
  uint32_t random_seed = 0;
};

// PyTorch's _orthogonalize on a batch of matrices [B, n, r] in place: Gram-Schmidt on the columns
// for r <= 2 (and half types), otherwise torch.linalg.qr's Q.
void Orthogonalize(const at::Tensor& matrices, double epsilon);

// PyTorch 1.13's powerSGD_hook (ddp_comm_hooks/powerSGD_hook.py, Vogels et al. 2019), operation for
// operation so that fitrun and PyTorch give the same numbers:
//
//  - The first start_powersgd_iter synchronizing steps all-reduce plainly (divided by the world
//    size first, as default._allreduce_fut does); PyTorch counts a step when its last bucket is
//    reduced, and so does this hook.
//  - Then, per bucket: the bucket's error from the previous step is added (error feedback); each
//    gradient viewed as a matrix [shape[0], -1] is compressed when (n + m) * r * min_compression_rate
//    < n * m (r = min(n, m, rank)); the others (biases, tiny layers) and the bucket's exact elements
//    are concatenated and all-reduced uncompressed. For the matrices M: P = M Q, all-reduce P,
//    orthogonalize P, Q = M^T P, all-reduce Q, Q /= world, M = P Q^T; the error is what
//    compression lost, the input minus its decompressed mean. Q is kept per bucket (warm start) and
//    orthogonalized again each step; the first time, it is drawn with torch.randn on CPU after
//    torch.manual_seed(RandomState(random_seed).randint(1e9)), one seed per bucket in bucket order.
//    Matrices are processed grouped by shape in order of first appearance, as PyTorch does.
//
// Where fitrun differs, without changing a number: the uncompressed all-reduce and P's start
// together in Start (PyTorch chains them), and Q's is issued from Wait on the training thread.
// The state (errors, Qs, step count) is not checkpointed: a resumed run starts over with
// start_powersgd_iter plain steps, as a PyTorch run that does not save its PowerSGDState.
class PowerSgdHook final : public CommHook {
 public:
  // INVALID_ARGUMENT naming the spec field for a rank below 1, or a start below 2 with error
  // feedback or warm start (PyTorch's PowerSGDState refuses it: DDP rebuilds its buckets after the
  // first step, which memorized state would not survive).
  static absl::StatusOr<std::unique_ptr<PowerSgdHook>> Create(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                              const PowerSgdOptions& options);

  PendingReduction Start(const GradBucket& bucket) override;
  std::string Describe() const override;

  // Synchronizing steps counted so far (PowerSGDState.iter).
  int64_t iter() const { return iter_; }
  // Elements before and after compression over the compressed steps (compression_stats()).
  int64_t numel_before_compression() const { return numel_before_; }
  int64_t numel_after_compression() const { return numel_after_; }

 private:
  // What PowerSGDState keeps per bucket index.
  struct BucketState {
    at::Tensor error;       // error_dict
    at::Tensor input_copy;  // the input after error feedback, to compute the next error from
    at::Tensor p_memory;    // p_memory_dict
    at::Tensor q_memory;    // q_memory_dict
  };

  PowerSgdHook(c10::intrusive_ptr<c10d::ProcessGroup> group, const PowerSgdOptions& options)
      : group_(std::move(group)), options_(options), rng_(options.random_seed) {}

  const c10::intrusive_ptr<c10d::ProcessGroup> group_;
  const PowerSgdOptions options_;
  LegacyNumpyRandomState rng_;
  std::map<int, BucketState> buckets_;  // node-based: pending reductions hold references
  int64_t iter_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_POWERSGD_HOOK_H_
