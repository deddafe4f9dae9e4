#include "worker/probe/memory_probe.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <exception>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/ddp/gradient_synchronizer.h"
#include "worker/models/workload.h"
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
// It also splits the step's peak in two phases, because a step's peak is the larger of two lines in
// the batch size: backward (saved activations and their gradients: steep) and the rest (optimizer
// step with its temporaries, zero_grad, forward: nearly flat). At small batches the flat one is the
// peak, so a single line through two small batches would underestimate large ones.
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

  absl::StatusOr<double> Synchronize(double local_loss) override {
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

// The line through two (batch, bytes) points: {fixed, per_sample}.
std::pair<int64_t, int64_t> Line(int64_t b1, int64_t p1, int64_t b2, int64_t p2) {
  const int64_t per_sample =
      static_cast<int64_t>(std::llround(static_cast<double>(p2 - p1) / static_cast<double>(b2 - b1)));
  return {p1 - per_sample * b1, per_sample};
}

// The probe's steps report nowhere.
class DiscardingSink final : public ProgressSink {
 public:
  void OnProgress(const StepProgress&) override {}
  void OnLog(const std::string&) override {}
  void Flush(absl::Duration) override {}
};

constexpr double kDefaultLearningRate = 1e-3;  // any positive rate allocates the same

}  // namespace

absl::StatusOr<ProbeResult> RunMemoryProbe(const fitrun::v1::WorkerAssignment& assignment,
                                           const ProbeOptions& options, CappedCpuAllocator* counter) {
  if (options.small_batch < 1 || options.large_batch <= options.small_batch) {
    return absl::InvalidArgumentError(absl::StrCat("--probe_batches: need 1 <= B1 < B2 (got ", options.small_batch,
                                                   ",", options.large_batch, ")"));
  }
  if (options.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("probe steps must be >= 1 (got ", options.steps, ")"));
  }
  if (counter == nullptr || counter->cap_bytes() != 0 || counter->installed()) {
    return absl::InvalidArgumentError("the probe needs an uncapped counting allocator not yet installed");
  }
  const fitrun::v1::JobSpec& spec = assignment.spec();
  if (spec.data().path().empty()) {
    return absl::InvalidArgumentError("spec.data.path: empty (the dataset's directory or file)");
  }
  if (assignment.cpu_threads_size() > 0 && assignment.cpu_threads(0) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads[0]: must be >= 0 (got ", assignment.cpu_threads(0), ")"));
  }
  at::set_num_interop_threads(1);
  at::set_num_threads(assignment.cpu_threads_size() > 0 && assignment.cpu_threads(0) > 0 ? assignment.cpu_threads(0)
                                                                                          : 1);

  absl::StatusOr<Workload> workload = LoadWorkload(spec, /*with_test=*/false);
  if (!workload.ok()) return workload.status();
  if (workload->train.size() < options.large_batch) {
    return absl::InvalidArgumentError(absl::StrCat("--probe_batches: B2 = ", options.large_batch,
                                                   " is larger than the ", workload->train.size(),
                                                   " training samples of spec.data.path"));
  }
  // Enough samples for every step at the large batch; the rest of the data is not needed. Loaded
  // before the allocator is installed, the data stays uncounted as it does in a training run.
  const int64_t slice = std::min<int64_t>(workload->train.size(), options.large_batch * options.steps);
  LabeledImages train{workload->train.images.narrow(0, 0, slice), workload->train.labels.narrow(0, 0, slice)};

  counter->Install();
  ProbeResult result;
  try {
    MoveModuleStateIntoAllocator(*workload->model);
    result.model_state_bytes = counter->Live();

    DiscardingSink sink;
    for (const int64_t batch : {options.small_batch, options.large_batch}) {
      TrainerOptions trainer_options;
      trainer_options.per_device_batch = batch;
      trainer_options.learning_rate =
          assignment.plan().learning_rate() > 0 ? assignment.plan().learning_rate() : kDefaultLearningRate;
      trainer_options.total_steps = options.steps;
      trainer_options.seed = spec.seed();
      trainer_options.optimizer = spec.optimizer();
      trainer_options.precision = spec.precision();
      trainer_options.progress_interval = absl::InfiniteDuration();
      // Gradients and optimizer state of the previous batch size are gone before the new peak starts.
      for (at::Tensor& p : workload->model->parameters()) p.mutable_grad() = at::Tensor();
      counter->ResetPeak();
      FlatBufferSynchronizer synchronizer(workload->model->parameters(), counter);
      absl::StatusOr<std::unique_ptr<Trainer>> trainer =
          Trainer::Create(trainer_options, workload->model, train, std::nullopt, &synchronizer, &sink);
      if (!trainer.ok()) return trainer.status();
      absl::StatusOr<TrainResult> run = (*trainer)->Run();
      if (!run.ok()) return run.status();
      synchronizer.Finish();
      result.peaks.push_back({batch, std::max(synchronizer.backward_peak(), synchronizer.other_peak()),
                              synchronizer.backward_peak(), synchronizer.other_peak()});
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("memory probe: ", e.what()));
  }

  const ProbePeak& small = result.peaks[0];
  const ProbePeak& large = result.peaks[1];
  std::tie(result.fixed_bytes, result.per_sample_bytes) =
      Line(small.batch, small.backward_peak_bytes, large.batch, large.backward_peak_bytes);
  std::tie(result.other_fixed_bytes, result.other_per_sample_bytes) =
      Line(small.batch, small.other_peak_bytes, large.batch, large.other_peak_bytes);
  return result;
}

std::string ProbeResultJson(const ProbeResult& r) {
  std::vector<std::string> peaks;
  for (const ProbePeak& p : r.peaks) {
    peaks.push_back(absl::StrCat("{\"batch\": ", p.batch, ", \"peak_bytes\": ", p.peak_bytes,
                                 ", \"backward_peak_bytes\": ", p.backward_peak_bytes,
                                 ", \"other_peak_bytes\": ", p.other_peak_bytes, "}"));
  }
  return absl::StrCat("{\"model_state_bytes\": ", r.model_state_bytes, ", \"peaks\": [", absl::StrJoin(peaks, ", "),
                      "], \"fixed_bytes\": ", r.fixed_bytes, ", \"per_sample_bytes\": ", r.per_sample_bytes,
                      ", \"other_fixed_bytes\": ", r.other_fixed_bytes,
                      ", \"other_per_sample_bytes\": ", r.other_per_sample_bytes, "}");
}

}  // namespace fitrun::worker
