#ifndef FITRUN_WORKER_DDP_C10D_OPTIMIZER_STATE_SHARDING_H_
#define FITRUN_WORKER_DDP_C10D_OPTIMIZER_STATE_SHARDING_H_

#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include "absl/status/statusor.h"
#include "worker/ddp/optimizer_state_sharding.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fitrun::worker {

// OptimizerStateSharding over a c10d process group: the stepped parameters are broadcast in place
// from their owners, one collective per parameter, all launched before the first wait so that they
// stream back to back; nothing is allocated beside the parameters.
class C10dOptimizerStateSharding final : public OptimizerStateSharding {
 public:
  // `parameters` are the model's, in its order (the owners follow PartitionParameters).
  static absl::StatusOr<std::unique_ptr<C10dOptimizerStateSharding>> Create(
      c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<at::Tensor> parameters);

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  const std::vector<int>& owners() const override { return owners_; }
  absl::Status ShareSteppedParameters() override;
  absl::StatusOr<bool> AllRanksSucceeded(bool ok) override;

 private:
  C10dOptimizerStateSharding(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<at::Tensor> parameters,
                             int rank, int world_size);

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<at::Tensor> parameters_;
  int rank_;
  int world_size_;
  std::vector<int> owners_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_C10D_OPTIMIZER_STATE_SHARDING_H_
