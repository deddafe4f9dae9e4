#include "worker/probe/memory_probe.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/options.h"
#include "worker/data/dataset_cache.h"
#include "worker/ddp/gradient_synchronizer.h"
#include "worker/models/workload.h"
#include "worker/runtime/compute_threads.h"
#include "worker/trainer/progress_sink.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {
namespace {

// Stands in for the bucketed reducer of a single rank (worker/ddp/bucketed_reducer.h) as far as
// memory goes: one flat buffer of every gradient plus the loss slot, allocated up front as the
// reducer's buckets are, with each parameter's gradient a view into it (the reducer's gradients
// are bucket views, so gradients and buckets share memory), and a gradient autograd allocated
// anew moved into its view as the reducer's hook does.
//
// It also records the peak by phase, backward (saved activations and their gradients) and the rest
// of the step (forward, the optimizer step with its temporaries, zero_grad), which shows where a
// peak comes from: at small batches often the optimizer step, at large ones backward.
class FlatBufferSynchronizer final : public GradientSynchronizer {
 public:
  FlatBufferSynchronizer(std::vector<at::Tensor> parameters, CappedCpuAllocator* counter)
      : parameters_(std::move(parameters)), counter_(counter) {
    int64_t elements = 1;
    for (const at::Tensor& p : parameters_) elements += p.numel();
    flat_ = at::zeros({elements}, at::kFloat);
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (at::Tensor& p : parameters_) {
      // Aliasing through set_ rather than a view, as the reducer does, so that zero_grad may detach_.
      views_.push_back(at::empty({0}, flat_.options()).set_(flat_.storage(), flat_.storage_offset() + offset, p.sizes()));
      p.mutable_grad() = views_.back();
      offset += p.numel();
    }
  }

  void BeforeBackward(bool) override {
    other_peak_ = std::max(other_peak_, counter_->Peak());
    counter_->ResetPeak();
  }

  absl::StatusOr<at::Tensor> SynchronizeWithLoss(const at::Tensor& local_loss) override {
    backward_peak_ = std::max(backward_peak_, counter_->Peak());
    counter_->ResetPeak();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      at::Tensor& grad = parameters_[i].mutable_grad();
      if (grad.defined() && grad.data_ptr() == views_[i].data_ptr()) continue;
      if (grad.defined()) {
        views_[i].copy_(grad);
      } else {
        views_[i].zero_();
      }
      grad = views_[i];
    }
    return local_loss;
  }

  // After the run: the last optimizer step's peak belongs to the rest.
  void Finish() { other_peak_ = std::max(other_peak_, counter_->Peak()); }
  int64_t backward_peak() const { return backward_peak_; }
  int64_t other_peak() const { return other_peak_; }

 private:
  std::vector<at::Tensor> parameters_;
  CappedCpuAllocator* const counter_;
  at::Tensor flat_;
  std::vector<at::Tensor> views_;
  int64_t backward_peak_ = 0;
  int64_t other_peak_ = 0;
};

// The probe's steps report nowhere but their time: the last step's, warm, is the measurement's.
class LastStepTimeSink final : public ProgressSink {
 public:
  void OnProgress(const StepProgress& progress) override { last_step_seconds_ = progress.step_seconds; }
  void OnLog(const std::string&) override {}
  void Flush(absl::Duration) override {}
  double last_step_seconds() const { return last_step_seconds_; }

 private:
  double last_step_seconds_ = 0;
};

constexpr double kDefaultLearningRate = 1e-3;  // any positive rate allocates the same

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryProbe>> MemoryProbe::Create(const fitrun::v1::WorkerAssignment& assignment,
                                                                CappedCpuAllocator* counter) {
  if (counter == nullptr || counter->installed()) {
    return absl::InvalidArgumentError("the probe needs a counting allocator not yet installed");
  }
  const fitrun::v1::JobSpec& spec = assignment.spec();
  if (spec.data().path().empty()) {
    return absl::InvalidArgumentError("spec.data.path: empty (the dataset's directory or file)");
  }
  if (assignment.cpu_threads_size() > 0 && assignment.cpu_threads(0) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads[0]: must be >= 0 (got ", assignment.cpu_threads(0), ")"));
  }
  SetComputeThreads(ProbeResourcesOf(assignment).cpu_threads);
  // Loaded before the allocator is installed, the data stays uncounted as it does in a training run.
  // Through the ranks' dataset cache: the probe is often the first to decode a dataset, and the
  // ranks that follow map what it wrote. Its stdout is the protocol; what the cache says goes to stderr.
  DatasetCache dataset_cache({assignment.dataset_cache_dir()});
  absl::StatusOr<Workload> workload = LoadWorkload(spec, /*with_test=*/false, &dataset_cache);
  if (!workload.ok()) return workload.status();
  std::unique_ptr<MemoryProbe> probe(new MemoryProbe(assignment, *std::move(workload), counter));
  counter->Install();
  try {
    MoveModuleStateIntoAllocator(*probe->workload_.model);
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat("the model's state alone needs more than the probe's budget of ",
                                                     counter->cap_bytes(), " bytes"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("memory probe: moving the model's state: ", e.what()));
  }
  probe->model_state_bytes_ = counter->Live();
  return probe;
}

absl::StatusOr<ProbePeak> MemoryProbe::Measure(int64_t batch, int steps) {
  if (batch < 1 || batch > train_samples()) {
    return absl::InvalidArgumentError(absl::StrCat("probe batch: must be in 1..", train_samples(),
                                                   " (the training samples of spec.data.path), got ", batch));
  }
  if (steps < 2) return absl::InvalidArgumentError(absl::StrCat("probe steps must be >= 2 (got ", steps, ")"));
  const fitrun::v1::JobSpec& spec = assignment_.spec();
  TrainerOptions trainer_options;
  trainer_options.per_device_batch = batch;
  trainer_options.learning_rate =
      assignment_.plan().learning_rate() > 0 ? assignment_.plan().learning_rate() : kDefaultLearningRate;
  trainer_options.total_steps = steps;
  trainer_options.seed = spec.seed();
  trainer_options.optimizer = spec.optimizer();
  trainer_options.precision = spec.precision();
  trainer_options.progress_interval = absl::ZeroDuration();  // every step, for the last one's time
  // Enough samples for every step; the trainer wraps into further epochs when the set is smaller.
  const int64_t slice = std::min<int64_t>(train_samples(), batch * steps);
  TensorDataset train = workload_.train.Slice(0, slice);
  try {
    // A fresh rank: no gradients and no optimizer state of an earlier measurement are alive.
    for (at::Tensor& p : workload_.model->parameters()) p.mutable_grad() = at::Tensor();
    counter_->ResetPeak();
    FlatBufferSynchronizer synchronizer(workload_.model->parameters(), counter_);
    LastStepTimeSink sink;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(trainer_options, workload_.model, train, std::nullopt, &synchronizer, &sink);
    if (!trainer.ok()) return trainer.status();
    absl::StatusOr<TrainResult> run = (*trainer)->Run();
    if (!run.ok()) return run.status();
    synchronizer.Finish();
    return ProbePeak{batch, std::max(synchronizer.backward_peak(), synchronizer.other_peak()),
                     synchronizer.backward_peak(), synchronizer.other_peak(), sink.last_step_seconds()};
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("memory probe at batch ", batch, ": ", e.what()));
  }
}

}  // namespace fitrun::worker
