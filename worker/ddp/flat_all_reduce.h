#ifndef FITRUN_WORKER_DDP_FLAT_ALL_REDUCE_H_
#define FITRUN_WORKER_DDP_FLAT_ALL_REDUCE_H_

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/statusor.h"
#include "worker/ddp/gradient_synchronizer.h"

namespace fitrun::worker {

// The simplest correct synchronizer: after the last backward, copies every gradient into one flat
// buffer, all-reduces it (SUM) in a single collective, divides by the world size and copies back.
// The step's local loss rides in the buffer's last element, so the global mean loss costs no extra
// collective. One collective per step keeps latency low for small models; it does not overlap
// communication with backward. Owned by the training thread.
class FlatAllReduceSynchronizer final : public GradientSynchronizer {
 public:
  // `parameters` in a fixed order that every rank shares (the module's registration order); those
  // that do not require gradients are skipped. All must be float32.
  static absl::StatusOr<std::unique_ptr<FlatAllReduceSynchronizer>> Create(
      c10::intrusive_ptr<c10d::ProcessGroup> group, const std::vector<at::Tensor>& parameters);

  void BeforeBackward(bool) override {}
  absl::StatusOr<at::Tensor> SynchronizeWithLoss(const at::Tensor& local_loss) override;
  // All of SynchronizeWithLoss: nothing of it overlaps backward.
  absl::Duration ExposedCommunication() const override { return exposed_; }

 private:
  FlatAllReduceSynchronizer(c10::intrusive_ptr<c10d::ProcessGroup> group,
                            std::vector<at::Tensor> parameters, at::Tensor flat);
  absl::StatusOr<at::Tensor> AllReduce(const at::Tensor& local_loss);

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<at::Tensor> parameters_;
  // Every gradient's slot, then the loss; allocated once and reused every step.
  at::Tensor flat_;
  int64_t gradient_elements_ = 0;
  absl::Duration exposed_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_FLAT_ALL_REDUCE_H_
