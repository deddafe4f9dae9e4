#include "worker/trainer/trainer.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "worker/memory/oom_error.h"
#include "worker/torch_compat.h"
#include "worker/trainer/fused_optimizers.h"

namespace fitrun::worker {
namespace {

// torch::optim's optimizer of the spec's kind, or its fused form (the same state, one kernel a step).
template <typename PlainT, typename FusedT, typename OptionsT>
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(bool fused, std::vector<at::Tensor> parameters,
                                                       const OptionsT& options) {
  if (fused) return std::make_unique<FusedT>(std::move(parameters), options);
  return std::make_unique<PlainT>(std::move(parameters), options);
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> CreateOptimizer(
    const TrainerOptions& options, std::vector<at::Tensor> parameters) {
  const fitrun::v1::OptimizerSpec& spec = options.optimizer;
  const bool fused =
      options.fused_optimizer.value_or(options.device.is_cuda() && torch_compat::HasFusedOptimizerKernels());
  if (fused && !torch_compat::HasFusedOptimizerKernels()) {
    return absl::InvalidArgumentError(absl::StrCat("fused optimizer kernels: this LibTorch (", TORCH_VERSION,
                                                   ") has none"));
  }
  switch (spec.kind()) {
    case fitrun::v1::OPTIMIZER_KIND_UNSPECIFIED:
    case fitrun::v1::OPTIMIZER_KIND_SGD:
      return MakeOptimizer<torch::optim::SGD, FusedSgd>(
          fused, std::move(parameters),
          torch::optim::SGDOptions(options.learning_rate).momentum(spec.momentum()).weight_decay(spec.weight_decay()));
    case fitrun::v1::OPTIMIZER_KIND_ADAM:
      return MakeOptimizer<torch::optim::Adam, FusedAdam>(
          fused, std::move(parameters),
          torch::optim::AdamOptions(options.learning_rate).weight_decay(spec.weight_decay()));
    case fitrun::v1::OPTIMIZER_KIND_ADAMW:
      return MakeOptimizer<torch::optim::AdamW, FusedAdamW>(
          fused, std::move(parameters),
          torch::optim::AdamWOptions(options.learning_rate).weight_decay(spec.weight_decay()));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.optimizer.kind: unknown optimizer ", static_cast<int>(spec.kind())));
  }
}

// Autocast for one forward pass, switched off again even when the forward throws: CPU autocast in
// bfloat16, or (CUDA builds, model on a CUDA device) CUDA autocast in float16 or bfloat16. Backward
// runs outside it and produces float32 gradients for float32 parameters either way, so the reducer
// and the optimizer do not change.
class AutocastScope {
 public:
  AutocastScope(fitrun::v1::Precision precision, bool on_cuda) {
    if (precision != fitrun::v1::PRECISION_BF16 && precision != fitrun::v1::PRECISION_FP16) return;
    const at::ScalarType dtype = precision == fitrun::v1::PRECISION_FP16 ? at::kHalf : at::kBFloat16;
    if (on_cuda) {
#ifdef FITRUN_WITH_CUDA
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(dtype);
      cuda_ = true;
#endif
    } else {
      // Trainer::Create refuses FP16 on the CPU, so this is bfloat16.
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(dtype);
      cpu_ = true;
    }
  }
  ~AutocastScope() {
    if (cpu_) at::autocast::set_cpu_enabled(false);
#ifdef FITRUN_WITH_CUDA
    if (cuda_) at::autocast::set_enabled(false);
#endif
    // Autocast caches the low-precision copies of the weights for the pass; they go stale when the
    // optimizer steps.
    if (cpu_ || cuda_) at::autocast::clear_cache();
  }
  bool active() const { return cpu_ || cuda_; }

  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool cpu_ = false;
  bool cuda_ = false;
};

// The model must be on the trainer's device before the reducer and the optimizer see its parameters
// (moving it later would leave them holding tensors elsewhere), so Create only checks.
absl::Status CheckModelDevice(const Model& model, const c10::Device& device) {
  for (const auto& item : model.named_parameters()) {
    if (item.value().device() != device) {
      return absl::InvalidArgumentError(absl::StrCat("model parameter ", item.key(), " is on ",
                                                     item.value().device().str(), " but the trainer's device is ",
                                                     device.str(), "; move the model there first"));
    }
  }
  for (const auto& item : model.named_buffers()) {
    if (item.value().device() != device) {
      return absl::InvalidArgumentError(absl::StrCat("model buffer ", item.key(), " is on ",
                                                     item.value().device().str(), " but the trainer's device is ",
                                                     device.str(), "; move the model there first"));
    }
  }
  return absl::OkStatus();
}

// Zeroes every parameter's gradient, keeping the tensors: the bucketed reducer's gradients are views
// into its buckets (worker/ddp/bucketed_reducer.h), and set to None (Optimizer::zero_grad's default
// from LibTorch 2.0) they would be allocated anew by the next backward, beside the buckets, every
// step. All of the model's parameters, not only those the optimizer steps: with sharded optimizer
// states a rank steps some of them, and every gradient is still reduced each step.
void ZeroGradientsInPlace(const std::vector<at::Tensor>& parameters) {
  at::NoGradGuard no_grad;
  for (at::Tensor p : parameters) {  // a handle: mutable_grad() needs a non-const one
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

double Percent(absl::Duration part, double total_seconds) {
  return total_seconds > 0 ? 100.0 * absl::ToDoubleSeconds(part) / total_seconds : 0.0;
}

}  // namespace

absl::Status ValidateTrainerOptions(const TrainerOptions& o, int64_t train_size) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o.rank, " is not in a world of ", o.world_size));
  }
  if (o.per_device_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.per_device_batch: must be >= 1 (got ", o.per_device_batch, ")"));
  }
  if (o.grad_accum_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.grad_accum_steps: must be >= 1 (got ", o.grad_accum_steps, ")"));
  }
  if (!(o.learning_rate > 0) || !std::isfinite(o.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.learning_rate: must be > 0 (got ", o.learning_rate, ")"));
  }
  if (o.total_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("plan.total_steps: must be >= 1 (got ", o.total_steps, ")"));
  }
  if (o.steps_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.steps_per_epoch: must be >= 0 (got ", o.steps_per_epoch, ")"));
  }
  const int64_t global_batch = o.per_device_batch * o.grad_accum_steps * o.world_size;
  if (global_batch > train_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: a global batch of ", global_batch, " (", o.world_size, " devices x ",
                     o.per_device_batch, " x ", o.grad_accum_steps,
                     " accumulation steps) is larger than the ", train_size, " training samples"));
  }
  if (o.steps_per_epoch * global_batch > train_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan.steps_per_epoch: ", o.steps_per_epoch, " steps of ", global_batch, " samples need ",
        o.steps_per_epoch * global_batch, " but the training set has ", train_size,
        " (at most ", train_size / global_batch, ")"));
  }
  const fitrun::v1::OptimizerSpec& optimizer = o.optimizer;
  if (!fitrun::v1::OptimizerKind_IsValid(optimizer.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.optimizer.kind: unknown optimizer ", static_cast<int>(optimizer.kind())));
  }
  if (optimizer.momentum() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.optimizer.momentum: must be >= 0 (got ", optimizer.momentum(), ")"));
  }
  if (optimizer.weight_decay() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.optimizer.weight_decay: must be >= 0 (got ", optimizer.weight_decay(), ")"));
  }
  if (!fitrun::v1::Precision_IsValid(o.precision)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.precision: unknown precision ", static_cast<int>(o.precision)));
  }
#ifndef FITRUN_WITH_CUDA
  if (o.precision == fitrun::v1::PRECISION_FP16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.precision: ", fitrun::v1::Precision_Name(o.precision),
        " needs a CUDA device (CPU workers support FP32 and BF16; this fitrun-worker is a CPU build)"));
  }
#endif
  if (o.checkpoint_every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.checkpoint.every_steps: must be >= 0 (got ",
                                                   o.checkpoint_every_steps, ")"));
  }
  if (o.loss_check_interval_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("loss check interval must be >= 0 (got ",
                                                   o.loss_check_interval_steps, ")"));
  }
  if (o.eval_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("eval batch must be >= 1 (got ", o.eval_batch, ")"));
  }
  return absl::OkStatus();
}

bool ProgressThrottle::ShouldReport(int64_t step, int64_t total_steps, absl::Time now) {
  if (step == 1 || step == total_steps || now - last_ >= interval_) {
    last_ = now;
    return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerOptions options,
                                                         std::shared_ptr<Model> model,
                                                         TensorDataset train,
                                                         std::optional<TensorDataset> test,
                                                         GradientSynchronizer* synchronizer,
                                                         ProgressSink* sink) {
  if (model == nullptr || synchronizer == nullptr || sink == nullptr) {
    return absl::InvalidArgumentError("trainer needs a model, a synchronizer and a sink");
  }
  if (absl::Status status = ValidateTrainerOptions(options, train.size()); !status.ok()) return status;
  if (options.steps_per_epoch == 0) {
    options.steps_per_epoch =
        train.size() / (options.per_device_batch * options.grad_accum_steps * options.world_size);
  }
  absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(
      {train.size(), options.world_size, options.rank, options.seed});
  if (!sampler.ok()) return sampler.status();
  if (!options.exit_process) options.exit_process = [](int code) { std::_Exit(code); };
  if (!options.exhaust_memory) {
    options.exhaust_memory = [] {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "fault injection: the device has no memory cap to exceed");
    };
  }

  // With sharded states, the optimizer sees only the parameters this rank owns.
  std::optional<OptimizerShard> shard;
  std::vector<at::Tensor> stepped = model->parameters();
  if (OptimizerStateSharding* sharding = options.optimizer_state_sharding; sharding != nullptr) {
    if (sharding->world_size() != options.world_size || sharding->rank() != options.rank ||
        sharding->owners().size() != stepped.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state sharding is for rank ", sharding->rank(), " of ", sharding->world_size(), " over ",
          sharding->owners().size(), " parameters, the trainer is rank ", options.rank, " of ", options.world_size,
          " over ", stepped.size()));
    }
    shard = OptimizerShard{options.rank, options.world_size, {}};
    std::vector<at::Tensor> owned;
    for (size_t i = 0; i < stepped.size(); ++i) {
      if (sharding->owners()[i] != options.rank) continue;
      owned.push_back(stepped[i]);
      shard->parameter_indices.push_back(static_cast<int>(i));
    }
    stepped = std::move(owned);
  }
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer;
  try {
    optimizer = CreateOptimizer(options, std::move(stepped));
  } catch (const std::exception& e) {
    return StatusFromTorchException(e, "creating the optimizer");
  }
  if (!optimizer.ok()) return optimizer.status();

  if (absl::Status status = CheckModelDevice(*model, options.device); !status.ok()) return status;
  const bool on_cuda = options.device.is_cuda();
  if (options.precision == fitrun::v1::PRECISION_FP16 && !on_cuda) {
    return absl::InvalidArgumentError(
        "spec.precision: PRECISION_FP16 needs a CUDA device, and this rank's model is on the CPU; use bf16 "
        "(CPU autocast) or fp32");
  }
  std::unique_ptr<GradScaler> scaler;
  if (options.loss_scaling.has_value() || (options.precision == fitrun::v1::PRECISION_FP16 && on_cuda)) {
    // bf16 has float32's exponent range, so only fp16 needs its loss scaled (as in PyTorch's AMP).
    absl::StatusOr<std::unique_ptr<GradScaler>> created =
        GradScaler::Create(options.loss_scaling.value_or(GradScaler::Options()));
    if (!created.ok()) return created.status();
    scaler = *std::move(created);
  }
  auto trainer = std::unique_ptr<Trainer>(new Trainer(std::move(options), std::move(model), std::move(train),
                                                      std::move(test), *std::move(sampler),
                                                      *std::move(optimizer), synchronizer, sink));
  trainer->on_cuda_ = on_cuda;
  trainer->loss_check_interval_ = trainer->options_.loss_check_interval_steps > 0
                                      ? trainer->options_.loss_check_interval_steps
                                      : (on_cuda ? kGpuLossCheckSteps : 1);
  trainer->scaler_ = std::move(scaler);
  trainer->shard_ = std::move(shard);
  return trainer;
}

Trainer::Trainer(TrainerOptions options, std::shared_ptr<Model> model, TensorDataset train,
                 std::optional<TensorDataset> test, DistributedSampler sampler,
                 std::unique_ptr<torch::optim::Optimizer> optimizer,
                 GradientSynchronizer* synchronizer, ProgressSink* sink)
    : options_(std::move(options)),
      model_(std::move(model)),
      train_(std::move(train)),
      test_(std::move(test)),
      sampler_(std::move(sampler)),
      optimizer_(std::move(optimizer)),
      synchronizer_(synchronizer),
      sink_(sink),
      parameters_(model_->parameters()) {}

Trainer::~Trainer() = default;

absl::StatusOr<TrainResult> Trainer::Run() {
  // LibTorch and c10d throw; nothing above this line should have to know.
  try {
    return RunUnchecked();
  } catch (const std::exception& e) {
    // Wherever the device's memory ran out (the caching allocator, a CUDA or cuBLAS allocation of
    // its own, a gradient hook rethrown by autograd), it is an OOM in this step.
    if (IsOutOfMemory(e)) return StatusFromTorchException(e, absl::StrCat("step ", current_step_));
    return absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
}

void Trainer::MaybeInjectFault(int64_t step) {
  const fitrun::v1::FaultInjection& fault = options_.fault_injection;
  if (fault.rank() != options_.rank || fault.at_step() != step) return;
  switch (fault.kind()) {
    case fitrun::v1::FaultInjection::KIND_EXIT:
      sink_->OnLog(absl::StrCat("fault injection: exiting with code ", fault.exit_code(), " before step ", step));
      sink_->Flush(absl::Seconds(1));
      options_.exit_process(fault.exit_code());
      return;
    case fitrun::v1::FaultInjection::KIND_OOM:
      sink_->OnLog(absl::StrCat("fault injection: asking for more memory than the device has left at step ", step));
      options_.exhaust_memory();  // throws c10::OutOfMemoryError, which Run() reports as on any OOM
      return;
    default:
      return;
  }
}

absl::Status Trainer::ResumeFrom(const CheckpointStore& store, int64_t step) {
  absl::StatusOr<TrainingPosition> position =
      store.Load(step, *model_, *optimizer_, shard_.has_value() ? &*shard_ : nullptr);
  if (!position.ok()) return position.status();
  const int64_t every = options_.steps_per_epoch;
  if (position->epoch * every + position->step_in_epoch != position->step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint of step ", position->step, " was taken at epoch ", position->epoch, " step ",
        position->step_in_epoch, ", which does not match ", every,
        " steps per epoch: the job's global batch or dataset changed"));
  }
  if (position->step >= options_.total_steps) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint of step ", position->step,
                                                      " is at or past plan.total_steps ",
                                                      options_.total_steps));
  }
  start_step_ = position->step;
  return absl::OkStatus();
}

absl::Status Trainer::MaybeCheckpoint(int64_t step) {
  const TrainerOptions& o = options_;
  if (o.checkpoints == nullptr) return absl::OkStatus();
  const bool due = step == o.total_steps || (o.checkpoint_every_steps > 0 && step % o.checkpoint_every_steps == 0);
  if (!due) return absl::OkStatus();
  const TrainingPosition position{step, step / o.steps_per_epoch, step % o.steps_per_epoch};
  const absl::Time start = absl::Now();
  CheckpointNotice notice{.rank = o.rank, .step = step};
  if (shard_.has_value()) {
    // Every rank's share of the states is durable before rank 0's checkpoint names them.
    absl::StatusOr<SavedCheckpoint> own = o.checkpoints->SaveOptimizerShard(step, *shard_, *optimizer_);
    absl::StatusOr<bool> all_saved = o.optimizer_state_sharding->AllRanksSucceeded(own.ok());
    if (!all_saved.ok()) return all_saved.status();
    if (o.rank != 0) {
      if (!own.ok()) sink_->OnLog(absl::StrCat("checkpoint of step ", step, ": ", own.status().message()));
      return absl::OkStatus();
    }
    if (!*all_saved) {
      notice.error = own.ok() ? "another rank could not save its optimizer states" : std::string(own.status().message());
      sink_->OnCheckpoint(notice);
      return absl::OkStatus();
    }
  }
  if (o.rank != 0) return absl::OkStatus();
  absl::StatusOr<SavedCheckpoint> saved =
      o.checkpoints->Save(position, *model_, *optimizer_, shard_.has_value() ? &*shard_ : nullptr);
  if (saved.ok()) {
    notice.path = saved->path;
    notice.bytes = saved->bytes;
    notice.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  } else {
    notice.error = std::string(saved.status().message());
  }
  sink_->OnCheckpoint(notice);
  return absl::OkStatus();
}

// What a run carries from one step to the next: where its time went, and what the last progress
// report covered.
struct Trainer::RunState {
  explicit RunState(absl::Duration progress_interval) : throttle(progress_interval) {}

  TrainResult::StepTimes times;
  ProgressThrottle throttle;
  absl::Time start;
  absl::Time last_report;
  int64_t samples_since_report = 0;
  int64_t step_at_report = 0;
  // The synchronizer's exposed communication at the last report.
  absl::Duration exposed_at_report;
  // The global losses, read back when a figure needs them.
  LossReadback losses;
};

// Charges the time since the last mark to a phase of the step.
class Trainer::PhaseClock {
 public:
  void Charge(absl::Duration& phase) {
    const absl::Time now = absl::Now();
    phase += now - mark_;
    mark_ = now;
  }

 private:
  absl::Time mark_ = absl::Now();
};

absl::StatusOr<TrainResult> Trainer::RunUnchecked() {
  const TrainerOptions& o = options_;
  model_->train();
  if (absl::Status s = StartMicroBatches(); !s.ok()) return s;
  RunState run(o.progress_interval);
  run.start = absl::Now();
  run.last_report = run.start;
  run.step_at_report = start_step_;
  run.exposed_at_report = synchronizer_->ExposedCommunication();
  for (int64_t step = start_step_ + 1; step <= o.total_steps; ++step) {
    current_step_ = step;
    if (absl::Status s = BeforeStep(step); !s.ok()) return s;
    PhaseClock clock;
    absl::StatusOr<at::Tensor> local_loss = ForwardAndBackward(step, clock, run.times);
    if (!local_loss.ok()) return local_loss.status();
    absl::StatusOr<at::Tensor> global_loss = synchronizer_->SynchronizeWithLoss(*local_loss);
    clock.Charge(run.times.synchronize);
    if (!global_loss.ok()) {
      return absl::Status(global_loss.status().code(),
                          absl::StrCat("step ", step, ": ", global_loss.status().message()));
    }
    run.losses.Add(step, *global_loss);
    if (LossCheckDue(step, o.total_steps, loss_check_interval_, o.checkpoint_every_steps)) {
      if (absl::Status s = CheckLosses(run); !s.ok()) return s;
    }
    if (absl::Status s = StepOptimizer(step); !s.ok()) return s;
    clock.Charge(run.times.optimizer);
    run.samples_since_report += o.per_device_batch * o.grad_accum_steps;
    if (absl::Status s = MaybeCheckpoint(step); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("checkpoint of step ", step, ": ", s.message()));
    }
    MaybeReportProgress(step, run);
  }
  return FinishRun(run);
}

absl::Status Trainer::StartMicroBatches() {
  MicroBatchOrder order;
  order.first_step = start_step_ + 1;
  order.total_steps = options_.total_steps;
  order.steps_per_epoch = options_.steps_per_epoch;
  order.grad_accum_steps = options_.grad_accum_steps;
  order.per_device_batch = options_.per_device_batch;
  absl::StatusOr<std::unique_ptr<MicroBatchSource>> batches =
      CreateMicroBatchSource(options_.data_placement, train_, sampler_, order, options_.device);
  if (!batches.ok()) return batches.status();
  batches_ = *std::move(batches);
  return absl::OkStatus();
}

absl::Status Trainer::BeforeStep(int64_t step) {
  if (stop_requested_.load()) return absl::CancelledError(absl::StrCat("stopped before step ", step));
  MaybeInjectFault(step);
  if (stop_requested_.load()) return absl::CancelledError(absl::StrCat("stopped before step ", step));
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Trainer::ForwardAndBackward(int64_t step, PhaseClock& clock,
                                                       TrainResult::StepTimes& times) {
  const TrainerOptions& o = options_;
  const int k = o.grad_accum_steps;
  ZeroGradientsInPlace(parameters_);
  clock.Charge(times.optimizer);
  // This rank's mean loss over the step's micro-batches, summed in float64 on the device as it
  // would be on the host, so that the host reads it once, after the all-reduce.
  at::Tensor local_loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(o.device));
  for (int m = 0; m < k; ++m) {
    absl::StatusOr<MicroBatch> batch = batches_->Get(step, m);
    if (!batch.ok()) return batch.status();
    clock.Charge(times.batch);
    at::Tensor micro_loss;
    {
      AutocastScope autocast(o.precision, on_cuda_);
      micro_loss = model_->Loss(batch->inputs, batch->targets);
      if (autocast.active()) micro_loss = micro_loss.to(at::kFloat);
    }
    clock.Charge(times.forward);
    synchronizer_->BeforeBackward(m == k - 1);
    // Scaled so that the accumulated gradient is the mean over the step's k*b samples.
    at::Tensor objective = micro_loss / k;
    if (scaler_ != nullptr) objective = scaler_->Scale(objective);
    objective.backward();
    local_loss += micro_loss.detach().to(at::kDouble) / k;
    clock.Charge(times.backward);
  }
  return local_loss;
}

absl::Status Trainer::StepOptimizer(int64_t step) {
  bool stepped = true;
  if (scaler_ != nullptr) {
    // The gradients are already the means over ranks, so every rank reaches the same verdict.
    const double scale = scaler_->scale();
    stepped = scaler_->UnscaleStepAndUpdate(parameters_, [this] { optimizer_->step(); });
    if (!stepped) {
      sink_->OnLog(absl::StrCat("step ", step, ": inf/NaN gradients at loss scale ", scale,
                                "; optimizer step skipped, loss scale now ", scaler_->scale()));
    }
  } else {
    optimizer_->step();
  }
  if (stepped && options_.optimizer_state_sharding != nullptr) {
    if (absl::Status s = options_.optimizer_state_sharding->ShareSteppedParameters(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::CheckLosses(RunState& run) {
  run.losses.ReadAll();
  // Every rank holds the same global losses and checks after the same steps, so every rank stops
  // here together.
  if (const std::optional<LossReadback::NonFinite>& bad = run.losses.first_non_finite(); bad.has_value()) {
    return absl::InternalError(absl::StrCat("loss is ", bad->loss, " at step ", bad->step, " (learning rate ",
                                            options_.learning_rate, " too high?)"));
  }
  return absl::OkStatus();
}

void Trainer::MaybeReportProgress(int64_t step, RunState& run) {
  const absl::Time now = absl::Now();
  if (!run.throttle.ShouldReport(step, options_.total_steps, now)) return;
  const double seconds = absl::ToDoubleSeconds(now - run.last_report);
  StepProgress progress;
  progress.rank = options_.rank;
  progress.step = step;
  progress.total_steps = options_.total_steps;
  progress.epoch = static_cast<int32_t>((step - 1) / options_.steps_per_epoch + 1);
  run.losses.ReadAll();
  progress.loss = run.losses.last_loss();
  progress.samples_per_second = seconds > 0 ? run.samples_since_report / seconds : 0;
  progress.step_seconds = seconds / static_cast<double>(std::max<int64_t>(1, step - run.step_at_report));
  const absl::Duration exposed = synchronizer_->ExposedCommunication();
  progress.exposed_communication_share =
      seconds > 0 ? absl::ToDoubleSeconds(exposed - run.exposed_at_report) / seconds : 0;
  sink_->OnProgress(progress);
  run.last_report = now;
  run.samples_since_report = 0;
  run.step_at_report = step;
  run.exposed_at_report = exposed;
}

absl::StatusOr<TrainResult> Trainer::FinishRun(RunState& run) {
  const TrainerOptions& o = options_;
  run.losses.ReadAll();  // already read at the last step, which always checks
  TrainResult result;
  result.steps = o.total_steps;
  result.final_loss = run.losses.last_loss();
  result.train_seconds = absl::ToDoubleSeconds(absl::Now() - run.start);
  result.parameter_checksum = ParameterChecksum(*model_);
  result.step_times = run.times;
  if (scaler_ != nullptr) {
    result.skipped_steps = scaler_->skipped_steps();
    result.loss_scale = scaler_->scale();
  }
  const TrainResult::StepTimes& times = run.times;
  if (o.total_steps > start_step_) {
    sink_->OnLog(absl::StrFormat(
        "step time: batch %.1f%%, forward %.1f%%, backward %.1f%%, synchronize %.1f%%, optimizer %.1f%% "
        "of %.3f s training over %d steps",
        Percent(times.batch, result.train_seconds), Percent(times.forward, result.train_seconds),
        Percent(times.backward, result.train_seconds), Percent(times.synchronize, result.train_seconds),
        Percent(times.optimizer, result.train_seconds), result.train_seconds, o.total_steps - start_step_));
  }
  if (scaler_ != nullptr) {
    sink_->OnLog(absl::StrCat("loss scaling: ", result.skipped_steps, " optimizer steps skipped, final scale ",
                              result.loss_scale));
  }
  if (absl::Status s = EvaluateTestSet(result); !s.ok()) return s;
  return result;
}

absl::Status Trainer::EvaluateTestSet(TrainResult& result) {
  if (!test_.has_value()) return absl::OkStatus();
  // On the training device, moved once (a no-op on the CPU); the models batch it from there.
  const TensorDataset test = test_->To(options_.device);
  absl::StatusOr<Evaluation> evaluation = model_->Evaluate(test, options_.eval_batch);
  if (!evaluation.ok()) return evaluation.status();
  sink_->OnLog(evaluation->summary);
  result.has_test_accuracy = evaluation->accuracy.has_value();
  result.test_accuracy = evaluation->accuracy.value_or(0);
  result.test_metrics = evaluation->metrics;
  return absl::OkStatus();
}

absl::StatusOr<double> EvaluateAccuracy(Model& model, const TensorDataset& set, int64_t batch) {
  absl::StatusOr<Evaluation> evaluation = model.Evaluate(set, batch);
  if (!evaluation.ok()) return evaluation.status();
  if (!evaluation->accuracy.has_value()) return absl::InvalidArgumentError("the model reports no accuracy");
  return *evaluation->accuracy;
}

}  // namespace fitrun::worker
