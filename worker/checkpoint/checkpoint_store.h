#ifndef FITRUN_WORKER_CHECKPOINT_CHECKPOINT_STORE_H_
#define FITRUN_WORKER_CHECKPOINT_CHECKPOINT_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fitrun::worker {

// Where training stands when a checkpoint is taken: enough to continue exactly. The sampler's order
// is a pure function of (seed, epoch), so its position is the epoch and the step within it.
struct TrainingPosition {
  int64_t step = 0;  // optimizer steps completed
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;  // steps of `epoch` completed
};

// A checkpoint that reached the disk.
struct SavedCheckpoint {
  int64_t step = 0;
  std::string path;
  int64_t bytes = 0;
};

// The share of the optimizer's states one rank keeps when they are sharded over the ranks
// (worker/ddp/optimizer_state_sharding.h): the model's parameters its optimizer steps, as indices
// into model.parameters(), in the optimizer's order.
struct OptimizerShard {
  int rank = 0;
  int world_size = 1;
  std::vector<int> parameter_indices;
};

// One job's checkpoints in one directory: ckpt-<step>.pt files, each holding the model's parameters
// and buffers, the optimizer's state, the training position and the CPU random generator's state.
// Tensors are saved from CPU copies and loaded onto the device the model is on, so a checkpoint taken
// on a CUDA device resumes on a CPU one and the other way round.
//
// Saves are atomic: the archive goes to a temporary file in the same directory, is fsynced, renamed
// over its final name and the directory is fsynced, so a crash or a full disk leaves either the new
// checkpoint or none, never a torn one, and older checkpoints are only pruned after the new one is
// durable. Each file ends with a CRC-32 of the archive, checked before LibTorch reads it. Loading skips
// files that are damaged or do not parse, so the newest *valid* checkpoint wins.
//
// Sharded optimizer states are saved by every rank, each in a file of its own beside the checkpoint
// (ckpt-<step>.pt.optimizer-<rank>-of-<ranks>, its states by parameter index), and rank 0's
// checkpoint, written once every rank's file is durable, records how many there are: a checkpoint
// whose files are not all there and intact does not load. States saved by n ranks load into a run of
// m ranks, sharded or not, and an unsharded checkpoint into a sharded run.
//
// Not thread-safe; rank 0's training thread saves the checkpoint (every rank its optimizer shard),
// every rank loads before training.
class CheckpointStore {
 public:
  struct Options {
    std::string dir;
    // spec.checkpoint.keep_last; checkpoints beyond the newest this many are deleted.
    int keep_last = 2;
  };

  // Creates the directory when missing.
  static absl::StatusOr<std::unique_ptr<CheckpointStore>> Create(const Options& options);

  // With `shard`, the optimizer's states are left to the ranks' SaveOptimizerShard files, all of
  // which must be durable before this is called; the checkpoint records shard->world_size of them.
  absl::StatusOr<SavedCheckpoint> Save(const TrainingPosition& position, const torch::nn::Module& model,
                                       const torch::optim::Optimizer& optimizer,
                                       const OptimizerShard* shard = nullptr);

  // One rank's optimizer states (the parameters `shard` names) for the checkpoint of `step`.
  absl::StatusOr<SavedCheckpoint> SaveOptimizerShard(int64_t step, const OptimizerShard& shard,
                                                     const torch::optim::Optimizer& optimizer);

  // Steps of the checkpoints on disk, newest first (whether they parse or not).
  std::vector<int64_t> Steps() const;

  // Loads the checkpoint of `step` into `model` and `optimizer` and restores the generator state:
  // the optimizer's states of the parameters `shard` names (all of the model's, in its order, when
  // null), from whichever files hold them. Every tensor is read onto the device of `model`'s
  // parameters: move the model to its device first. DataLoss for a file that does not load, or a
  // missing optimizer shard; ResourceExhausted when the device's memory ran out.
  absl::StatusOr<TrainingPosition> Load(int64_t step, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                        const OptimizerShard* shard = nullptr) const;

  // The newest checkpoint that loads, or nullopt when there is none. Unreadable newer files are
  // skipped (they are reported in the returned status only when nothing loads); running out of the
  // device's memory ends the search (ResourceExhausted).
  absl::StatusOr<std::optional<TrainingPosition>> LoadLatest(torch::nn::Module& model,
                                                             torch::optim::Optimizer& optimizer) const;

  std::string PathFor(int64_t step) const;
  std::string OptimizerShardPathFor(int64_t step, int rank, int world_size) const;

 private:
  explicit CheckpointStore(Options options) : options_(std::move(options)) {}

  // The checkpoint of `step` and its optimizer shards, whatever their number.
  void Remove(int64_t step) const;

  Options options_;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_CHECKPOINT_CHECKPOINT_STORE_H_
