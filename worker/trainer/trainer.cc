#include "worker/trainer/trainer.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
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
#include "absl/time/clock.h"

namespace fitrun::worker {
namespace {

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> CreateOptimizer(
    const TrainerOptions& options, std::vector<at::Tensor> parameters) {
  const fitrun::v1::OptimizerSpec& spec = options.optimizer;
  switch (spec.kind()) {
    case fitrun::v1::OPTIMIZER_KIND_UNSPECIFIED:
    case fitrun::v1::OPTIMIZER_KIND_SGD:
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::SGD(
          std::move(parameters), torch::optim::SGDOptions(options.learning_rate)
                                     .momentum(spec.momentum())
                                     .weight_decay(spec.weight_decay())));
    case fitrun::v1::OPTIMIZER_KIND_ADAM:
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::Adam(
          std::move(parameters),
          torch::optim::AdamOptions(options.learning_rate).weight_decay(spec.weight_decay())));
    case fitrun::v1::OPTIMIZER_KIND_ADAMW:
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::AdamW(
          std::move(parameters),
          torch::optim::AdamWOptions(options.learning_rate).weight_decay(spec.weight_decay())));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.optimizer.kind: unknown optimizer ", static_cast<int>(spec.kind())));
  }
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
  if (o.precision != fitrun::v1::PRECISION_UNSPECIFIED && o.precision != fitrun::v1::PRECISION_FP32 &&
      o.precision != fitrun::v1::PRECISION_BF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.precision: ", fitrun::v1::Precision_Name(o.precision),
        " needs a CUDA device (CPU workers support FP32 and BF16)"));
  }
  if (o.checkpoint_every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.checkpoint.every_steps: must be >= 0 (got ",
                                                   o.checkpoint_every_steps, ")"));
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
                                                         LabeledImages train,
                                                         std::optional<LabeledImages> test,
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

  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer;
  try {
    optimizer = CreateOptimizer(options, model->parameters());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("creating the optimizer: ", e.what()));
  }
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<Trainer>(new Trainer(std::move(options), std::move(model), std::move(train),
                                              std::move(test), *std::move(sampler),
                                              *std::move(optimizer), synchronizer, sink));
}

Trainer::Trainer(TrainerOptions options, std::shared_ptr<Model> model, LabeledImages train,
                 std::optional<LabeledImages> test, DistributedSampler sampler,
                 std::unique_ptr<torch::optim::Optimizer> optimizer,
                 GradientSynchronizer* synchronizer, ProgressSink* sink)
    : options_(std::move(options)),
      model_(std::move(model)),
      train_(std::move(train)),
      test_(std::move(test)),
      sampler_(std::move(sampler)),
      optimizer_(std::move(optimizer)),
      synchronizer_(synchronizer),
      sink_(sink) {}

Trainer::~Trainer() = default;

absl::StatusOr<TrainResult> Trainer::Run() {
  // LibTorch and c10d throw; nothing above this line should have to know.
  try {
    return RunUnchecked();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("step ", current_step_, ": out of device memory: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
}

void Trainer::MaybeInjectFault(int64_t step) {
  const fitrun::v1::FaultInjection& fault = options_.fault_injection;
  if (fault.kind() != fitrun::v1::FaultInjection::KIND_EXIT || fault.rank() != options_.rank ||
      fault.at_step() != step) {
    return;
  }
  sink_->OnLog(absl::StrCat("fault injection: exiting with code ", fault.exit_code(), " before step ",
                            step));
  sink_->Flush(absl::Seconds(1));
  options_.exit_process(fault.exit_code());
}

absl::Status Trainer::ResumeFrom(const CheckpointStore& store, int64_t step) {
  absl::StatusOr<TrainingPosition> position = store.Load(step, *model_, *optimizer_);
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

void Trainer::MaybeCheckpoint(int64_t step) {
  const TrainerOptions& o = options_;
  if (o.checkpoints == nullptr || o.rank != 0) return;
  const bool due = step == o.total_steps || (o.checkpoint_every_steps > 0 && step % o.checkpoint_every_steps == 0);
  if (!due) return;
  const TrainingPosition position{step, step / o.steps_per_epoch, step % o.steps_per_epoch};
  absl::StatusOr<SavedCheckpoint> saved = o.checkpoints->Save(position, *model_, *optimizer_);
  if (!saved.ok()) {
    sink_->OnLog(absl::StrCat("checkpoint of step ", step, " failed, keeping the previous one: ",
                              saved.status().message()));
    return;
  }
  sink_->OnCheckpointSaved({o.rank, saved->step, saved->path, saved->bytes});
}

absl::StatusOr<TrainResult> Trainer::RunUnchecked() {
  const TrainerOptions& o = options_;
  const int64_t b = o.per_device_batch;
  const int k = o.grad_accum_steps;
  model_->train();

  ProgressThrottle throttle(o.progress_interval);
  const absl::Time start = absl::Now();
  absl::Time last_report = start;
  int64_t samples_since_report = 0;
  int64_t cached_epoch = -1;
  std::vector<int64_t> shard;
  double loss = 0;

  for (int64_t step = start_step_ + 1; step <= o.total_steps; ++step) {
    current_step_ = step;
    if (stop_requested_.load()) {
      return absl::CancelledError(absl::StrCat("stopped before step ", step));
    }
    MaybeInjectFault(step);
    if (stop_requested_.load()) {
      return absl::CancelledError(absl::StrCat("stopped before step ", step));
    }

    const int64_t epoch = (step - 1) / o.steps_per_epoch;
    const int64_t step_in_epoch = (step - 1) % o.steps_per_epoch;
    if (epoch != cached_epoch) {
      shard = sampler_.EpochIndices(epoch);
      cached_epoch = epoch;
    }

    optimizer_->zero_grad();
    double local_loss = 0;
    for (int m = 0; m < k; ++m) {
      const int64_t begin = (step_in_epoch * k + m) * b;
      const at::Tensor indices = at::from_blob(shard.data() + begin, {b}, at::kLong);
      const at::Tensor inputs = train_.images.index_select(0, indices);
      const at::Tensor targets = train_.labels.index_select(0, indices);
      at::Tensor micro_loss;
      if (o.precision == fitrun::v1::PRECISION_BF16) {
        // CPU autocast runs matmuls and convolutions in bfloat16 on float32 parameters; backward
        // then produces float32 gradients, so the reducer and optimizer are unchanged.
        at::autocast::set_cpu_enabled(true);
        at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
        try {
          micro_loss = model_->Loss(inputs, targets).to(at::kFloat);
        } catch (...) {
          at::autocast::set_cpu_enabled(false);
          throw;
        }
        at::autocast::set_cpu_enabled(false);
        at::autocast::clear_cache();
      } else {
        micro_loss = model_->Loss(inputs, targets);
      }
      synchronizer_->BeforeBackward(m == k - 1);
      // Scaled so that the accumulated gradient is the mean over the step's k*b samples.
      (micro_loss / k).backward();
      local_loss += micro_loss.item<double>() / k;
    }
    absl::StatusOr<double> global_loss = synchronizer_->Synchronize(local_loss);
    if (!global_loss.ok()) {
      return absl::Status(global_loss.status().code(),
                          absl::StrCat("step ", step, ": ", global_loss.status().message()));
    }
    loss = *global_loss;
    // Every rank sees the same global loss, so every rank stops here together.
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("loss is ", loss, " at step ", step,
                                              " (learning rate ", o.learning_rate, " too high?)"));
    }
    optimizer_->step();
    samples_since_report += b * k;
    MaybeCheckpoint(step);

    const absl::Time now = absl::Now();
    if (throttle.ShouldReport(step, o.total_steps, now)) {
      const double seconds = absl::ToDoubleSeconds(now - last_report);
      StepProgress progress;
      progress.rank = o.rank;
      progress.step = step;
      progress.total_steps = o.total_steps;
      progress.epoch = static_cast<int32_t>(epoch + 1);
      progress.loss = loss;
      progress.samples_per_second = seconds > 0 ? samples_since_report / seconds : 0;
      sink_->OnProgress(progress);
      last_report = now;
      samples_since_report = 0;
    }
  }

  TrainResult result;
  result.steps = o.total_steps;
  result.final_loss = loss;
  result.train_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.parameter_checksum = ParameterChecksum(*model_);
  if (test_.has_value()) {
    absl::StatusOr<Evaluation> evaluation = model_->Evaluate(*test_, o.eval_batch);
    if (!evaluation.ok()) return evaluation.status();
    sink_->OnLog(evaluation->summary);
    result.has_test_accuracy = evaluation->accuracy.has_value();
    result.test_accuracy = evaluation->accuracy.value_or(0);
  }
  return result;
}

absl::StatusOr<double> EvaluateAccuracy(Model& model, const LabeledImages& set, int64_t batch) {
  absl::StatusOr<Evaluation> evaluation = model.Evaluate(set, batch);
  if (!evaluation.ok()) return evaluation.status();
  if (!evaluation->accuracy.has_value()) return absl::InvalidArgumentError("the model reports no accuracy");
  return *evaluation->accuracy;
}

}  // namespace fitrun::worker
