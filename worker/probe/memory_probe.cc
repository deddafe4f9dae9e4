#include "worker/probe/memory_probe.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#ifdef FITRUN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/log.h"
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

// Makes the plan's GPU this process's, caps its caching allocator at the probe's budget (0: none) and
// moves `model` there.
absl::StatusOr<c10::Device> ModelOnGpu(const PlanDevice& gpu, int64_t budget_bytes, Model& model) {
#ifdef FITRUN_WITH_CUDA
  try {
    const int available = c10::cuda::device_count();
    if (gpu.index >= available) {
      return absl::InvalidArgumentError(absl::StrCat("plan.device_ids[0] is cuda:", gpu.index, " but this process sees ",
                                                     available, " CUDA devices"));
    }
    const auto index = static_cast<c10::DeviceIndex>(gpu.index);
    c10::cuda::set_device(index);
    if (budget_bytes > 0) {
      const double total = static_cast<double>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
      c10::cuda::CUDACachingAllocator::setMemoryFraction(std::min(1.0, budget_bytes / total), index);
    }
    const c10::Device device(c10::kCUDA, index);
    model.to(device);
    return device;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cuda:", gpu.index, ": ", e.what()));
  }
#else
  (void)gpu, (void)budget_bytes, (void)model;
  return absl::UnimplementedError("this fitrun-worker was built without CUDA");
#endif
}

}  // namespace

std::optional<PlanDevice> ProbeTimingDeviceOf(const fitrun::v1::WorkerAssignment& assignment) {
  if (assignment.plan().device_ids_size() == 0) return std::nullopt;
  absl::StatusOr<PlanDevice> device = ParsePlanDevice(assignment.plan().device_ids(0), "plan.device_ids[0]");
  if (!device.ok() || device->kind != PlanDevice::Kind::kCuda) return std::nullopt;
  return *device;
}

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
  if (std::optional<PlanDevice> gpu = ProbeTimingDeviceOf(assignment); gpu.has_value()) {
    // A model of its own on the GPU, loaded before the counting allocator is installed: the host's
    // measurement neither sees it nor shares a model with it.
    absl::StatusOr<Workload> timed = LoadWorkload(spec, /*with_test=*/false, &dataset_cache);
    absl::StatusOr<c10::Device> device =
        timed.ok() ? ModelOnGpu(*gpu, ProbeResourcesOf(assignment).memory_cap_bytes, *timed->model) : timed.status();
    if (device.ok()) {
      probe->timing_device_ = *device;
      probe->timed_ = *std::move(timed);
    } else {
      contract::LogWarning("memory probe: steps timed on the host, not on %s: %s", assignment.plan().device_ids(0),
                           device.status().message());
    }
  }
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

TrainerOptions MemoryProbe::RunOptions(int64_t batch, int steps, const c10::Device& device) const {
  const fitrun::v1::JobSpec& spec = assignment_.spec();
  TrainerOptions options;
  options.device = device;
  options.per_device_batch = batch;
  options.learning_rate =
      assignment_.plan().learning_rate() > 0 ? assignment_.plan().learning_rate() : kDefaultLearningRate;
  options.total_steps = steps;
  options.seed = spec.seed();
  options.optimizer = spec.optimizer();
  options.precision = spec.precision();
  options.progress_interval = absl::ZeroDuration();  // every step, for the last one's time
  // A rank on a GPU keeps its data there (where the plan leaves room); the few samples the probe
  // steps through always fit.
  if (device.is_cuda()) options.data_placement = DataPlacement::kDevice;
  return options;
}

absl::StatusOr<ProbePeak> MemoryProbe::Measure(int64_t batch, int steps) {
  if (batch < 1 || batch > train_samples()) {
    return absl::InvalidArgumentError(absl::StrCat("probe batch: must be in 1..", train_samples(),
                                                   " (the training samples of spec.data.path), got ", batch));
  }
  if (steps < 2) return absl::InvalidArgumentError(absl::StrCat("probe steps must be >= 2 (got ", steps, ")"));
  // Enough samples for every step; the trainer wraps into further epochs when the set is smaller.
  const TensorDataset train = workload_.train.Slice(0, std::min<int64_t>(train_samples(), batch * steps));
  ProbePeak peak;
  try {
    // A fresh rank: no gradients and no optimizer state of an earlier measurement are alive.
    for (at::Tensor& p : workload_.model->parameters()) p.mutable_grad() = at::Tensor();
    counter_->ResetPeak();
    FlatBufferSynchronizer synchronizer(workload_.model->parameters(), counter_);
    LastStepTimeSink sink;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(
        RunOptions(batch, steps, c10::Device(c10::kCPU)), workload_.model, train, std::nullopt, &synchronizer, &sink);
    if (!trainer.ok()) return trainer.status();
    absl::StatusOr<TrainResult> run = (*trainer)->Run();
    if (!run.ok()) return run.status();
    synchronizer.Finish();
    peak = ProbePeak{batch, std::max(synchronizer.backward_peak(), synchronizer.other_peak()),
                     synchronizer.backward_peak(), synchronizer.other_peak(), sink.last_step_seconds()};
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("memory probe at batch ", batch, ": ", e.what()));
  }
  if (timed_.has_value()) {
    // The host's step time says nothing of the GPU's: a batch the GPU could not time is not timed.
    absl::StatusOr<double> seconds = TimeOnDevice(batch, steps);
    if (!seconds.ok()) {
      contract::LogWarning("memory probe: batch %d not timed on %s: %s", batch, timing_device_.str(),
                           seconds.status().message());
    }
    peak.step_seconds = seconds.value_or(0);
  }
  return peak;
}

absl::StatusOr<double> MemoryProbe::TimeOnDevice(int64_t batch, int steps) {
  Model& model = *timed_->model;
  const TensorDataset train = timed_->train.Slice(0, std::min<int64_t>(timed_->train.size(), batch * steps));
  absl::StatusOr<double> seconds;
  try {
    for (at::Tensor& p : model.parameters()) p.mutable_grad() = at::Tensor();
    LocalGradientSynchronizer synchronizer;
    LastStepTimeSink sink;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(
        RunOptions(batch, steps, timing_device_), timed_->model, train, std::nullopt, &synchronizer, &sink);
    absl::StatusOr<TrainResult> run = trainer.ok() ? (*trainer)->Run() : absl::StatusOr<TrainResult>(trainer.status());
    // Each step's progress report read its loss back, so the last step's time is the device's own.
    seconds = run.ok() ? absl::StatusOr<double>(sink.last_step_seconds()) : run.status();
  } catch (const std::exception& e) {
    seconds = absl::InternalError(e.what());
  }
  for (at::Tensor& p : model.parameters()) p.mutable_grad() = at::Tensor();
#ifdef FITRUN_WITH_CUDA
  // What this batch held goes back to the device, so that the next batch's time starts from the same.
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  return seconds;
}

}  // namespace fitrun::worker
