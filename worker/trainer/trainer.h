#ifndef FITRUN_WORKER_TRAINER_TRAINER_H_
#define FITRUN_WORKER_TRAINER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"
#include "worker/data/fashion_mnist.h"
#include "worker/checkpoint/checkpoint_store.h"
#include "worker/data/sampler.h"
#include "worker/ddp/gradient_synchronizer.h"
#include "worker/ddp/optimizer_state_sharding.h"
#include "worker/models/model.h"
#include "worker/trainer/grad_scaler.h"
#include "worker/trainer/loss_readback.h"
#include "worker/trainer/micro_batches.h"
#include "worker/trainer/progress_sink.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace fitrun::worker {

// What one rank's training loop needs; the plan's numbers are authoritative.
struct TrainerOptions {
  int rank = 0;
  int world_size = 1;
  // Where this rank computes (the plan's device_ids[rank]): the model's parameters must already be
  // there (Create checks); micro-batches and the test set are moved there from host memory.
  c10::Device device = c10::Device(c10::kCPU);
  // Where the training set lives while the rank trains (worker/trainer/micro_batches.h): on the host
  // (the CPU's way), or on a GPU, moved there once, or gathered ahead into pinned host memory.
  DataPlacement data_placement = DataPlacement::kHost;
  int64_t per_device_batch = 0;
  int grad_accum_steps = 1;
  // plan.learning_rate (already scaled for the global batch); optimizer.lr is not used.
  double learning_rate = 0;
  int64_t total_steps = 0;
  // 0 means floor(train size / global batch).
  int64_t steps_per_epoch = 0;
  uint64_t seed = 0;
  // kind, momentum and weight_decay; UNSPECIFIED means SGD.
  fitrun::v1::OptimizerSpec optimizer;
  // The optimizer's step in fused kernels (worker/trainer/fused_optimizers.h): unset chooses them on
  // a CUDA device where LibTorch has them (2.x); true asks for them on any device, and fails Create
  // where LibTorch has none; false keeps torch::optim's step.
  std::optional<bool> fused_optimizer;
  fitrun::v1::FaultInjection fault_injection;
  // Progress goes to the sink at most this often, plus the first and the last step.
  absl::Duration progress_interval = absl::Milliseconds(250);
  // How often, in steps, the host reads the global losses back and stops on one that is not finite
  // (worker/trainer/loss_readback.h): 0 chooses every step on the CPU, where a read costs nothing,
  // and every kGpuLossCheckSteps on a GPU, where each read makes the host wait for the device. A
  // progress report reads its own step's loss whenever it goes out, and checkpoints and the last
  // step always check.
  int64_t loss_check_interval_steps = 0;
  // Test samples per evaluation forward pass (fitrun-worker uses the per-device batch).
  int64_t eval_batch = 1000;
  // spec.precision: FP32 (or UNSPECIFIED) everywhere, or autocast for forward and loss (parameters,
  // gradients, all-reduce and optimizer stay float32): BF16 on CPU; in a CUDA build (FITRUN_WITH_CUDA)
  // on a model whose parameters are on a CUDA device, FP16 with dynamic loss scaling or BF16.
  fitrun::v1::Precision precision = fitrun::v1::PRECISION_FP32;
  // Dynamic loss scaling (GradScaler). FP16 on CUDA turns it on with PyTorch's defaults when this is
  // unset; set, it applies to any precision and device (on CPU in fp32, scaling by a power of two
  // changes no bit of the training, which is how the tests exercise it).
  std::optional<GradScaler::Options> loss_scaling;
  // Where rank 0 saves (null: no checkpoints), every checkpoint_every_steps steps (0: only at the
  // end) and after the last step. Must outlive the trainer.
  CheckpointStore* checkpoints = nullptr;
  int64_t checkpoint_every_steps = 0;
  // Optimizer states sharded over the ranks (ZeRO stage 1; null: every rank keeps them all): this
  // rank's optimizer steps the parameters it owns, and they reach the other ranks after each step.
  // Every rank then saves its share of a checkpoint's states. Must outlive the trainer.
  OptimizerStateSharding* optimizer_state_sharding = nullptr;
  // How a KIND_EXIT fault ends the process; tests replace it.
  std::function<void(int exit_code)> exit_process;
  // How a KIND_OOM fault makes the device refuse an allocation for real: asks the capped allocator
  // for more than is left (it throws c10::OutOfMemoryError). Tests replace it.
  std::function<void()> exhaust_memory;
};

// TrainerOptions::loss_check_interval_steps on a GPU: a diverging run goes on for at most this many
// steps before it stops, and the host waits for the device once per this many steps.
inline constexpr int64_t kGpuLossCheckSteps = 50;

// What a rank reports when it finishes.
struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  std::string parameter_checksum;
  double train_seconds = 0;
  bool has_test_accuracy = false;
  double test_accuracy = 0;
  // The evaluation's figures by name (Evaluation::metrics).
  std::map<std::string, double> test_metrics;
  // Under loss scaling: optimizer steps skipped for inf/NaN gradients, and the scale at the end.
  int64_t skipped_steps = 0;
  double loss_scale = 0;
  // Where this run's step time went, summed over its steps (the rest of train_seconds is reporting,
  // checkpoints and the test-set evaluation).
  struct StepTimes {
    absl::Duration batch;        // assembling micro-batches from the shard
    absl::Duration forward;      // forward and loss (under autocast when asked)
    absl::Duration backward;     // backward, including the reducer's hooks and bucket launches
    absl::Duration synchronize;  // GradientSynchronizer::SynchronizeWithLoss: the last bucket's and the wait
    absl::Duration optimizer;    // zero_grad, unscaling and the optimizer step
  };
  StepTimes step_times;
};

// Decides which steps are reported: the first, the last, and otherwise at most one per interval.
class ProgressThrottle {
 public:
  explicit ProgressThrottle(absl::Duration interval) : interval_(interval) {}
  bool ShouldReport(int64_t step, int64_t total_steps, absl::Time now);

 private:
  absl::Duration interval_;
  absl::Time last_ = absl::InfinitePast();
};

// One rank's data-parallel training loop: each step runs grad_accum_steps micro-batches of
// per_device_batch samples from this rank's share of the epoch, lets the synchronizer average the
// gradients over ranks, and steps the optimizer; at the end the rank with a test set evaluates it.
// It knows neither gRPC nor c10d: progress leaves through a ProgressSink and ranks meet only inside
// the GradientSynchronizer. Run() belongs to one thread; RequestStop() may be called from any.
class Trainer {
 public:
  // `test` is given to the rank that evaluates (rank 0). `synchronizer` and `sink` must outlive the
  // trainer. Fails with InvalidArgument naming the plan field when the numbers do not fit the data.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(TrainerOptions options,
                                                         std::shared_ptr<Model> model,
                                                         TensorDataset train,
                                                         std::optional<TensorDataset> test,
                                                         GradientSynchronizer* synchronizer,
                                                         ProgressSink* sink);
  ~Trainer();

  // Trains to total_steps. Cancelled after RequestStop(); Unavailable/DeadlineExceeded when a
  // collective fails; ResourceExhausted when the device's memory ran out (c10::OutOfMemoryError, or a
  // CUDA allocation outside the caching allocator: worker/memory/oom_error.h; in step
  // current_step()); Internal for another LibTorch error or a non-finite loss.
  absl::StatusOr<TrainResult> Run();

  // Loads the checkpoint of `step` (model, optimizer, RNG) so that Run() continues after it exactly
  // as the run that saved it would have. Every rank calls it with the same step before Run().
  absl::Status ResumeFrom(const CheckpointStore& store, int64_t step);

  // Optimizer steps already done when Run() starts (0, or the step a checkpoint restored).
  int64_t start_step() const { return start_step_; }

  // The step Run() is in, or was in when it returned (1-based; 0 before it starts). Same thread as Run().
  int64_t current_step() const { return current_step_; }

  // Makes Run() return Cancelled before its next step.
  void RequestStop() { stop_requested_.store(true); }

  const TrainerOptions& options() const { return options_; }

 private:
  Trainer(TrainerOptions options, std::shared_ptr<Model> model, TensorDataset train,
          std::optional<TensorDataset> test, DistributedSampler sampler,
          std::unique_ptr<torch::optim::Optimizer> optimizer, GradientSynchronizer* synchronizer,
          ProgressSink* sink);

  struct RunState;
  class PhaseClock;

  // The loop: each step's parts below, in order.
  absl::StatusOr<TrainResult> RunUnchecked();
  // Where the micro-batches come from, for a run starting after start_step_.
  absl::Status StartMicroBatches();
  // Cancelled when a stop was requested; runs the spec's fault injection.
  absl::Status BeforeStep(int64_t step);
  // Fault injection: ends the process before `step` when the spec says so.
  void MaybeInjectFault(int64_t step);
  // Zeroes the gradients and runs the step's micro-batches, forward and backward; returns this rank's
  // mean loss over them (float64, on the device).
  absl::StatusOr<at::Tensor> ForwardAndBackward(int64_t step, PhaseClock& clock, TrainResult::StepTimes& times);
  // The optimizer step (skipped under loss scaling when a gradient is not finite), then the stepped
  // parameters shared when the optimizer states are sharded. An error means a collective failed.
  absl::Status StepOptimizer(int64_t step);
  // Reads the pending losses; Internal when one was not finite, naming its step.
  absl::Status CheckLosses(RunState& run);
  // A progress report after `step` when the throttle lets one through.
  void MaybeReportProgress(int64_t step, RunState& run);
  // After the last step: the run's figures and logs, and rank 0's evaluation.
  absl::StatusOr<TrainResult> FinishRun(RunState& run);
  absl::Status EvaluateTestSet(TrainResult& result);
  // Rank 0's checkpoint after `step` (with sharded states, every rank's share first); a failed
  // write is logged and training goes on. An error means a collective failed.
  absl::Status MaybeCheckpoint(int64_t step);

  TrainerOptions options_;
  std::shared_ptr<Model> model_;
  // Whether options_.device is a CUDA device: picks CUDA autocast over CPU autocast.
  bool on_cuda_ = false;
  // options_.loss_check_interval_steps, resolved for the device.
  int64_t loss_check_interval_ = 1;
  // Set when loss scaling is on (FP16 on CUDA, or TrainerOptions::loss_scaling).
  std::unique_ptr<GradScaler> scaler_;
  TensorDataset train_;
  std::optional<TensorDataset> test_;
  DistributedSampler sampler_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  GradientSynchronizer* synchronizer_;
  ProgressSink* sink_;
  // With sharded optimizer states: which of the model's parameters this rank's optimizer steps.
  std::optional<OptimizerShard> shard_;
  // Every parameter of the model, in registration order (the ones the optimizer steps or not).
  const std::vector<at::Tensor> parameters_;
  // Set when Run starts, from where its first step is.
  std::unique_ptr<MicroBatchSource> batches_;
  std::atomic<bool> stop_requested_{false};
  int64_t start_step_ = 0;
  int64_t current_step_ = 0;
};

// Checks the plan's numbers against a training set of `train_size` samples; errors name the plan
// field. Trainer::Create runs it too; a worker calls it early to fail before the rendezvous.
absl::Status ValidateTrainerOptions(const TrainerOptions& options, int64_t train_size);

// The accuracy Model::Evaluate reports (top-1 for classifiers); InvalidArgument for a model without one.
absl::StatusOr<double> EvaluateAccuracy(Model& model, const TensorDataset& set, int64_t batch);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_TRAINER_H_
