// fitrun-worker: one rank of a fitrun job. Started by fitrund (or by hand) with the torchrun
// environment plus FITRUN_*; see worker/options.h for the contract and ExitCode for what the exit
// status means. With --probe it instead measures one rank's peak memory at the micro-batch sizes the
// coordinator's calibration asks for (worker/probe/memory_probe.h).
#include <ATen/Parallel.h>
#include <unistd.h>
#ifdef FITRUN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <fstream>
#include <iostream>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fitrun/v1/launch_contract.h"
#include "worker/checkpoint/checkpoint_store.h"
#include "worker/data/sampler.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/process_group.h"
#include "worker/memory/capped_allocator.h"
#include "worker/models/model.h"
#include "worker/models/workload.h"
#include "worker/options.h"
#include "worker/probe/memory_probe.h"
#include "worker/report/grpc_reporter.h"
#include "worker/trainer/progress_sink.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {
namespace {

// What the exit status means (fitrun/v1/launch_contract.h), by the names this file uses.
using ExitCode = fitrun::v1::launch::ExitCode;
constexpr ExitCode kSuccess = fitrun::v1::launch::kExitSuccess;
constexpr ExitCode kTrainingFailed = fitrun::v1::launch::kExitTrainingFailed;
constexpr ExitCode kBadConfiguration = fitrun::v1::launch::kExitBadConfiguration;
constexpr ExitCode kOutOfMemory = fitrun::v1::launch::kExitOutOfMemory;
constexpr ExitCode kStopped = fitrun::v1::launch::kExitStopped;

// After a StopCommand the loop ends at its next step; a rank stuck in a collective or the rendezvous
// is ended this long after the command instead.
constexpr absl::Duration kStopGrace = absl::Seconds(3);
// How long a rank whose collective failed waits for a StopCommand that explains it.
constexpr absl::Duration kStopRace = absl::Seconds(1);
constexpr absl::Duration kFinishTimeout = absl::Seconds(5);
constexpr absl::Duration kFailTimeout = absl::Seconds(2);
constexpr int kDefaultCollectiveTimeoutSeconds = 60;
constexpr absl::Duration kMinRendezvousTimeout = absl::Seconds(60);

// Carries a StopCommand (reporter's reader thread) to the training loop (main thread).
class StopSwitch {
 public:
  void Stop(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    reason_ = reason;
    if (trainer_ != nullptr) trainer_->RequestStop();
    std::thread([] {
      absl::SleepFor(kStopGrace);
      std::fprintf(stderr, "fitrun-worker: still running %s after the stop command; exiting\n",
                   absl::FormatDuration(kStopGrace).c_str());
      std::_Exit(kStopped);
    }).detach();
  }
  // Returns false when a stop already arrived.
  bool Attach(Trainer* trainer) {
    absl::MutexLock lock(&mu_);
    trainer_ = trainer;
    return !stopped_;
  }
  bool stopped() const {
    absl::MutexLock lock(&mu_);
    return stopped_;
  }
  // True when a stop arrived or arrives within `timeout`.
  bool WaitForStop(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopped_), timeout);
    return stopped_;
  }
  std::string reason() const {
    absl::MutexLock lock(&mu_);
    return reason_;
  }

 private:
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  Trainer* trainer_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// A device's memory as its allocator counts it.
struct MemoryFigures {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};

// Stamps each progress report with the device allocator's live and peak bytes before passing it on:
// the capped allocator's on a virtual CPU device, the CUDA caching allocator's on a GPU.
class MemoryStampingSink final : public ProgressSink {
 public:
  MemoryStampingSink(ProgressSink* next, std::function<MemoryFigures()> measure)
      : next_(next), measure_(std::move(measure)) {}

  void OnProgress(const StepProgress& progress) override {
    StepProgress stamped = progress;
    const MemoryFigures figures = measure_();
    stamped.live_bytes = figures.live_bytes;
    stamped.peak_bytes = figures.peak_bytes;
    next_->OnProgress(stamped);
  }
  void OnLog(const std::string& text) override { next_->OnLog(text); }
  void OnCheckpointSaved(const CheckpointNotice& checkpoint) override { next_->OnCheckpointSaved(checkpoint); }
  void Flush(absl::Duration timeout) override { next_->Flush(timeout); }

 private:
  ProgressSink* next_;
  std::function<MemoryFigures()> measure_;
};

#ifdef FITRUN_WITH_CUDA
MemoryFigures CudaMemoryFigures(c10::DeviceIndex index) {
  const c10::cuda::CUDACachingAllocator::DeviceStats stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const auto& bytes =
      stats.allocated_bytes[static_cast<size_t>(c10::cuda::CUDACachingAllocator::StatType::AGGREGATE)];
  return {bytes.current, bytes.peak};
}
#endif

// The torch::Device for this rank's plan device, made the process's current CUDA device when it is
// one. A "cpu:N" device is a budget on the host, so every N is LibTorch's CPU device. A CUDA device
// in a build without CUDA is a configuration error, not a crash.
absl::StatusOr<c10::Device> UseDevice(const PlanDevice& device, const std::string& field,
                                      const std::string& device_id) {
  if (device.kind == PlanDevice::Kind::kCpu) return c10::Device(c10::kCPU);
#ifdef FITRUN_WITH_CUDA
  const int available = c10::cuda::device_count();
  if (device.index >= available) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", device_id, " but this process sees ", available,
                                                   " CUDA devices (check CUDA_VISIBLE_DEVICES)"));
  }
  const auto index = static_cast<c10::DeviceIndex>(device.index);
  try {
    c10::cuda::set_device(index);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(field, ": cannot use ", device_id, ": ", e.what()));
  }
  return c10::Device(c10::kCUDA, index);
#else
  return absl::InvalidArgumentError(absl::StrCat(
      "fitrun-worker was built without CUDA; ", field, " is ", device_id,
      ". Build it with LIBTORCH_HOME pointing at a LibTorch with libtorch_cuda.so, or run the job on CPU "
      "devices (fitrund --devices=cpu:...)"));
#endif
}

TrainerOptions TrainerOptionsFor(const fitrun::v1::WorkerAssignment& a, const WorkerOptions& o) {
  TrainerOptions options;
  options.rank = o.rank;
  options.world_size = o.world_size;
  options.per_device_batch = a.plan().per_device_batch();
  options.grad_accum_steps = a.plan().grad_accum_steps();
  options.learning_rate = a.plan().learning_rate();
  options.total_steps = a.plan().total_steps();
  options.steps_per_epoch = a.plan().steps_per_epoch();
  options.seed = a.spec().seed();
  options.optimizer = a.spec().optimizer();
  // A fault belongs to one attempt (the first by default), so the attempt that recovers runs clean.
  const int fault_attempt = std::max(1, a.spec().fault_injection().attempt());
  if (a.attempt() == fault_attempt || (a.attempt() == 0 && fault_attempt == 1)) {
    options.fault_injection = a.spec().fault_injection();
  }
  options.precision = a.spec().precision();
  options.checkpoint_every_steps = a.spec().checkpoint().every_steps();
  // Evaluating in micro-batches of the training batch never needs more memory than a training step
  // (forward only, without gradients), so the plan that fits training fits the evaluation too.
  options.eval_batch = std::max<int64_t>(1, a.plan().per_device_batch());
  return options;
}

// Writes what another implementation needs to reproduce this run from its first step: every
// parameter as raw little-endian float32 in registration order (parameters.f32), one line per
// parameter "name dim0 dim1 ..." (parameters.txt), and the sample order of the epochs the run
// touches as int64 (sample_order.i64, epoch after epoch, each a permutation of the training set).
absl::Status DumpInitialState(const std::string& dir, const torch::nn::Module& model, int64_t train_size,
                              uint64_t seed, int64_t epochs) {
  std::ofstream values(dir + "/parameters.f32", std::ios::binary);
  std::ofstream manifest(dir + "/parameters.txt");
  for (const auto& item : model.named_parameters()) {
    const at::Tensor t = item.value().detach().to(at::kCPU).contiguous();
    values.write(static_cast<const char*>(t.data_ptr()), t.numel() * sizeof(float));
    manifest << item.key();
    for (int64_t d : t.sizes()) manifest << " " << d;
    manifest << "\n";
  }
  std::ofstream order(dir + "/sample_order.i64", std::ios::binary);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<int64_t> permutation = DistributedSampler::Permutation(train_size, seed, epoch);
    order.write(reinterpret_cast<const char*>(permutation.data()), permutation.size() * sizeof(int64_t));
  }
  if (!values || !manifest || !order) {
    return absl::UnavailableError(absl::StrCat("FITRUN_DUMP_INITIAL_STATE: cannot write to ", dir));
  }
  return absl::OkStatus();
}

// One rank from start to exit code: builds every piece from the options and the assignment, runs the
// loop on the calling thread, and makes sure the coordinator hears how it ended (RankFinished or
// RankFailed) before the process exits. Errors before the rendezvous are the job's fault (exit 2);
// after it, training's (exit 1).
class Worker {
 public:
  explicit Worker(const WorkerOptions& options) : options_(options), console_(options.rank, stderr) {}

  int Run() {
    if (!options_.coordinator.empty()) {
      GrpcReporter::Options reporter_options;
      reporter_options.coordinator = options_.coordinator;
      reporter_options.job_id = options_.job_id;
      reporter_options.attempt = options_.attempt;
      reporter_options.rank = options_.rank;
      reporter_options.world_size = options_.world_size;
      reporter_options.job_token = options_.job_token;
      reporter_options.pid = static_cast<int>(getpid());
      auto reporter = GrpcReporter::Create(reporter_options, [this](const std::string& reason) {
        console_.OnLog(absl::StrCat("stop command from the coordinator: ", reason));
        stop_.Stop(reason);
      });
      if (!reporter.ok()) return Fail(kBadConfiguration, reporter.status());
      reporter_ = *std::move(reporter);
      sink_ = std::make_unique<TeeSink>(std::vector<ProgressSink*>{&console_, reporter_.get()});
    } else {
      sink_ = std::make_unique<TeeSink>(std::vector<ProgressSink*>{&console_});
      console_.OnLog("FITRUN_COORDINATOR not set: standalone, reports go to this log only");
    }
    return Train();
  }

 private:
  int Train() {
    absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = LoadAssignment(options_.assignment_path);
    if (!assignment.ok()) return Fail(kBadConfiguration, assignment.status());
    if (absl::Status s = ValidateAssignment(*assignment, options_); !s.ok()) {
      return Fail(kBadConfiguration, s);
    }
    const fitrun::v1::JobSpec& spec = assignment->spec();
    const std::string& device_id = assignment->plan().device_ids(options_.rank);
    const std::string device_field = absl::StrCat("plan.device_ids[", options_.rank, "]");
    absl::StatusOr<PlanDevice> plan_device = ParsePlanDevice(device_id, device_field);
    if (!plan_device.ok()) return Fail(kBadConfiguration, plan_device.status());
    absl::StatusOr<c10::Device> device = UseDevice(*plan_device, device_field, device_id);
    if (!device.ok()) return Fail(kBadConfiguration, device.status());
    device_ = *device;

    const int threads = assignment->cpu_threads_size() > 0 && assignment->cpu_threads(options_.rank) > 0
                            ? assignment->cpu_threads(options_.rank)
                            : 1;
    at::set_num_interop_threads(1);
    at::set_num_threads(threads);

    const absl::Time load_start = absl::Now();
    absl::StatusOr<Workload> workload = LoadWorkload(spec, /*with_test=*/options_.rank == 0);
    if (!workload.ok()) return Fail(kBadConfiguration, workload.status());

    TrainerOptions trainer_options = TrainerOptionsFor(*assignment, options_);
    trainer_options.device = device_;
    if (absl::Status s = ValidateTrainerOptions(trainer_options, workload->train.size()); !s.ok()) {
      return Fail(kBadConfiguration, s);
    }
    sink_->OnLog(absl::StrCat("rank ", options_.rank, "/", options_.world_size, " on ",
                              assignment->plan().device_ids(options_.rank), ": model ",
                              workload->description, ", ", workload->train.size(), " training samples loaded in ",
                              absl::FormatDuration(absl::Now() - load_start), ", per-device batch ",
                              trainer_options.per_device_batch, " x ", trainer_options.grad_accum_steps,
                              " accumulation, lr ", trainer_options.learning_rate, ", ",
                              trainer_options.total_steps, " steps, ", threads, " threads"));
    // The training loop's sink: progress carries live and peak bytes when the device has a cap.
    ProgressSink* trainer_sink = sink_.get();
    const bool has_cap = assignment->memory_cap_bytes_size() > 0 && assignment->memory_cap_bytes(options_.rank) > 0;
    if (has_cap && device_.is_cpu()) {
      const int64_t cap = assignment->memory_cap_bytes(options_.rank);
      // Never freed: LibTorch keeps the installed allocator for the rest of the process, and other
      // threads may allocate through it until exit. The training data loaded above is host data
      // and stays uncounted, as the estimator leaves it out.
      memory_ = new CappedCpuAllocator(cap);
      memory_->Install();
      try {
        MoveModuleStateIntoAllocator(*workload->model);
      } catch (const std::exception& e) {
        return Fail(kBadConfiguration, absl::ResourceExhaustedError(absl::StrCat(
                                           "the model's parameters do not fit the memory cap: ", e.what())));
      }
      trainer_options.exhaust_memory = [memory = memory_] {
        // More than the cap leaves: the capped allocator refuses it, exactly as a full device would.
        const int64_t beyond = memory->cap_bytes() - memory->Live() + (1LL << 20);
        (void)torch::empty({beyond}, torch::kUInt8);
      };
      memory_sink_ = std::make_unique<MemoryStampingSink>(
          sink_.get(), [memory = memory_] { return MemoryFigures{memory->Live(), memory->Peak()}; });
      trainer_sink = memory_sink_.get();
      sink_->OnLog(absl::StrCat("memory cap ", cap, " bytes enforced; model state ", memory_->Live(),
                                " bytes"));
    }
    if (!device_.is_cpu()) {
      // Parameters and buffers move before the broadcast, the reducer and the optimizer see them.
      try {
        workload->model->to(device_);
      } catch (const std::exception& e) {
        return Fail(kBadConfiguration, absl::ResourceExhaustedError(absl::StrCat(
                                           "moving the model to ", device_.str(), ": ", e.what())));
      }
#ifdef FITRUN_WITH_CUDA
      // A CUDA device's limit is its own memory, enforced by the device; the caching allocator counts.
      if (device_.is_cuda()) {
        const c10::DeviceIndex index = device_.index();
        trainer_options.exhaust_memory = [index] {
          // More than the whole device: the caching allocator refuses it with a real OutOfMemoryError.
          const int64_t beyond = static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem) + (1LL << 20);
          (void)torch::empty({beyond}, torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, index));
        };
        memory_sink_ = std::make_unique<MemoryStampingSink>(sink_.get(), [index] { return CudaMemoryFigures(index); });
        trainer_sink = memory_sink_.get();
      }
#endif
      sink_->OnLog(absl::StrCat("model on ", device_.str(),
                                has_cap ? "; memory_cap_bytes is not enforced on it (the device's own memory is the limit)"
                                        : ""));
    }

    const int timeout_seconds = spec.ddp().collective_timeout_seconds() > 0
                                    ? spec.ddp().collective_timeout_seconds()
                                    : kDefaultCollectiveTimeoutSeconds;
    ProcessGroupOptions group_options;
    group_options.master_addr = options_.master_addr;
    group_options.master_port = options_.master_port;
    group_options.rank = options_.rank;
    group_options.world_size = options_.world_size;
    group_options.collective_timeout = absl::Seconds(timeout_seconds);
    group_options.rendezvous_timeout = std::max(absl::Seconds(timeout_seconds), kMinRendezvousTimeout);
    group_options.backend = device_.is_cuda() ? CollectiveBackend::kNccl : CollectiveBackend::kGloo;

    std::unique_ptr<CheckpointStore> checkpoints;
    if (!assignment->checkpoint_dir().empty()) {
      absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Create(
          {assignment->checkpoint_dir(), spec.checkpoint().keep_last() > 0 ? spec.checkpoint().keep_last() : 2});
      if (!store.ok()) return Fail(kBadConfiguration, store.status());
      checkpoints = *std::move(store);
      trainer_options.checkpoints = checkpoints.get();
    }
    const absl::Time join_start = absl::Now();
    absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group = ConnectProcessGroup(group_options);
    if (!group.ok()) return Fail(kTrainingFailed, group.status());
    if (absl::Status s = BroadcastModuleState(**group, *workload->model); !s.ok()) return Fail(kTrainingFailed, s);
    sink_->OnLog(absl::StrCat("joined the process group at ", options_.master_addr, ":",
                              options_.master_port, " in ", absl::FormatDuration(absl::Now() - join_start),
                              "; parameters ", ParameterChecksum(*workload->model), " after rank 0's broadcast"));

    BucketedReducer::Options bucket_options;
    if (spec.ddp().bucket_cap_mb() > 0) {
      bucket_options.bucket_cap_bytes = static_cast<int64_t>(spec.ddp().bucket_cap_mb() * (1 << 20));
    }
    absl::StatusOr<std::unique_ptr<BucketedReducer>> synchronizer =
        BucketedReducer::Create(*group, workload->model->parameters(), bucket_options);
    if (!synchronizer.ok()) return Fail(kTrainingFailed, synchronizer.status());
    const int64_t train_size = workload->train.size();
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(trainer_options, workload->model, std::move(workload->train), std::move(workload->test),
                        synchronizer->get(), trainer_sink);
    if (!trainer.ok()) {
      return Fail(trainer.status().code() == absl::StatusCode::kInvalidArgument ? kBadConfiguration
                                                                                 : kTrainingFailed,
                  trainer.status());
    }

    if (checkpoints != nullptr) {
      if (absl::Status s = Resume(**group, *checkpoints, **trainer, *workload->model); !s.ok()) {
        return Fail(kTrainingFailed, s);
      }
    }
    if (!options_.initial_state_dump_dir.empty() && options_.rank == 0) {
      const TrainerOptions& o = (*trainer)->options();
      const int64_t epochs = (o.total_steps + o.steps_per_epoch - 1) / o.steps_per_epoch;
      if (absl::Status s = DumpInitialState(options_.initial_state_dump_dir, *workload->model, train_size,
                                            o.seed, epochs);
          !s.ok()) {
        return Fail(kBadConfiguration, s);
      }
    }

    if (!stop_.Attach(trainer->get())) return Stopped();
    absl::StatusOr<TrainResult> result = (*trainer)->Run();
    stop_.Attach(nullptr);
    if (!result.ok()) {
      if (result.status().code() == absl::StatusCode::kCancelled && stop_.stopped()) return Stopped();
      if (result.status().code() == absl::StatusCode::kResourceExhausted) {
        return OutOfMemory((*trainer)->current_step(), trainer_options.per_device_batch, result.status());
      }
      // When the coordinator stops a job, the first rank to obey breaks its peers' all-reduce before
      // their own StopCommand has arrived; a failed collective followed shortly by a stop is a stop.
      if (IsCollectiveFailure(result.status()) && reporter_ != nullptr && stop_.WaitForStop(kStopRace)) {
        console_.OnLog(absl::StrCat("collective failed while stopping: ", result.status().message()));
        return Stopped();
      }
      return Fail(kTrainingFailed, result.status());
    }
    LogCommunication(**synchronizer, *result, (*trainer)->start_step(), trainer_options);
    return Finish(*result);
  }

  // Every rank resumes from rank 0's newest checkpoint that loads: rank 0 picks it, broadcasts its
  // step, every rank loads that file (model, optimizer, RNG), and the parameters are broadcast again
  // so that ranks are bitwise equal even if a rank's file read differed.
  absl::Status Resume(c10d::ProcessGroup& group, const CheckpointStore& store, Trainer& trainer,
                      const torch::nn::Module& model) {
    int64_t step = -1;
    if (options_.rank == 0) {
      for (int64_t candidate : store.Steps()) {
        absl::Status s = trainer.ResumeFrom(store, candidate);
        if (s.ok()) {
          step = candidate;
          break;
        }
        sink_->OnLog(absl::StrCat("skipping checkpoint of step ", candidate, ": ", s.message()));
      }
    }
    absl::StatusOr<int64_t> chosen = BroadcastInt64(group, step, device_);
    if (!chosen.ok()) return chosen.status();
    if (*chosen < 0) return absl::OkStatus();
    if (options_.rank != 0) {
      if (absl::Status s = trainer.ResumeFrom(store, *chosen); !s.ok()) return s;
    }
    if (absl::Status s = BroadcastModuleState(group, model); !s.ok()) return s;
    sink_->OnLog(absl::StrCat("resumed from the checkpoint of step ", *chosen, " (", store.PathFor(*chosen),
                              "); parameters ", ParameterChecksum(model)));
    return absl::OkStatus();
  }

  // The figures the benchmark and an operator want: this rank's throughput and the share of training
  // time spent blocked on gradient communication that backward did not hide.
  void LogCommunication(const BucketedReducer& reducer, const TrainResult& result, int64_t start_step,
                        const TrainerOptions& o) {
    const BucketedReducer::CommStats stats = reducer.comm_stats();
    const double wait = absl::ToDoubleSeconds(stats.wait_time);
    const double samples = static_cast<double>(result.steps - start_step) * o.per_device_batch *
                           o.grad_accum_steps * o.world_size;
    sink_->OnLog(absl::StrFormat(
        "communication: %d buckets, exposed all-reduce wait %.3f s over %d steps = %.1f%% of %.3f s "
        "training; %.1f samples/s (all ranks)",
        static_cast<int>(reducer.BucketLayout().size()), wait, stats.synchronized_steps,
        result.train_seconds > 0 ? 100.0 * wait / result.train_seconds : 0.0, result.train_seconds,
        result.train_seconds > 0 ? samples / result.train_seconds : 0.0));
  }

  int Finish(const TrainResult& result) {
    std::string summary = absl::StrCat("finished ", result.steps, " steps in ",
                                       absl::FormatDuration(absl::Seconds(result.train_seconds)),
                                       ": final loss ", result.final_loss, ", parameter checksum ",
                                       result.parameter_checksum);
    if (result.has_test_accuracy) absl::StrAppend(&summary, ", test accuracy ", result.test_accuracy);
    console_.OnLog(summary);
    if (reporter_ != nullptr) {
      fitrun::v1::RankFinished finished;
      finished.set_rank(options_.rank);
      finished.set_steps(result.steps);
      finished.set_final_loss(result.final_loss);
      finished.set_parameter_checksum(result.parameter_checksum);
      finished.set_has_test_accuracy(result.has_test_accuracy);
      finished.set_test_accuracy(result.test_accuracy);
      finished.set_train_seconds(result.train_seconds);
      reporter_->ReportFinished(finished);
      reporter_->Shutdown(kFinishTimeout);
    }
    return kSuccess;
  }

  int Fail(ExitCode code, const absl::Status& status) {
    const std::string reason(status.message());
    std::fprintf(stderr, "fitrun-worker: rank %d failed: %s\n", options_.rank, reason.c_str());
    std::fflush(stderr);
    if (reporter_ != nullptr) {
      reporter_->ReportFailed(reason);
      reporter_->Shutdown(kFailTimeout);
    }
    return code;
  }

  // The device's cap was hit: the OutOfMemory event carries what the coordinator needs to replan
  // (the request refused, what was live then, the batch), and goes out before the RankFailed. On a
  // CUDA device the caching allocator's counters give live and peak and the device's total memory
  // is the cap; the refused request is only in the error's text and is left 0. Without either, the
  // bytes stay 0 and the batch alone tells the coordinator what not to plan again.
  int OutOfMemory(int64_t step, int64_t per_device_batch, const absl::Status& status) {
    fitrun::v1::OutOfMemory oom;
    oom.set_rank(options_.rank);
    oom.set_step(step);
    oom.set_per_device_batch(per_device_batch);
    if (memory_ != nullptr) {
      oom.set_requested_bytes(memory_->LastFailedRequest());
      oom.set_live_bytes(memory_->LiveAtLastFailure());
      oom.set_peak_bytes(memory_->Peak());
      oom.set_cap_bytes(memory_->cap_bytes());
    }
#ifdef FITRUN_WITH_CUDA
    if (device_.is_cuda()) {
      try {
        const MemoryFigures figures = CudaMemoryFigures(device_.index());
        oom.set_live_bytes(figures.live_bytes);
        oom.set_peak_bytes(figures.peak_bytes);
        oom.set_cap_bytes(static_cast<int64_t>(at::cuda::getDeviceProperties(device_.index())->totalGlobalMem));
      } catch (const std::exception& e) {
        console_.OnLog(absl::StrCat("reading CUDA memory statistics: ", e.what()));
      }
    }
#endif
    console_.OnLog(absl::StrCat("out of memory at step ", step, ": requested ", oom.requested_bytes(),
                                " bytes with ", oom.live_bytes(), " live (peak ", oom.peak_bytes(),
                                ") of a ", oom.cap_bytes(), "-byte cap at per-device batch ", per_device_batch));
    if (reporter_ != nullptr) reporter_->ReportOutOfMemory(oom);
    return Fail(kOutOfMemory, status);
  }

  int Stopped() {
    return Fail(kStopped, absl::CancelledError(absl::StrCat("stopped by the coordinator: ", stop_.reason())));
  }

  static bool IsCollectiveFailure(const absl::Status& status) {
    return status.code() == absl::StatusCode::kUnavailable ||
           status.code() == absl::StatusCode::kDeadlineExceeded;
  }

  const WorkerOptions options_;
  ConsoleSink console_;
  StopSwitch stop_;
  std::unique_ptr<GrpcReporter> reporter_;
  std::unique_ptr<TeeSink> sink_;
  // This rank's device (plan.device_ids[rank]), set at the start of Train().
  c10::Device device_ = c10::Device(c10::kCPU);
  CappedCpuAllocator* memory_ = nullptr;  // see Train(): deliberately never freed
  std::unique_ptr<MemoryStampingSink> memory_sink_;
};

std::optional<std::string> GetEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// What the command line may say; without --probe the worker trains as its environment describes.
struct CommandLine {
  bool probe = false;
  // --probe_batches=B1,B2,...: measure these and exit; empty: read batch sizes from stdin.
  std::vector<int64_t> probe_batches;
};

absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  CommandLine command_line;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--probe") {
      command_line.probe = true;
    } else if (absl::StartsWith(arg, "--probe_batches=")) {
      const std::string value = arg.substr(std::string("--probe_batches=").size());
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int64_t batch = 0;
        if (!absl::SimpleAtoi(part, &batch) || batch < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--probe_batches: expected micro-batch sizes B1,B2,... each >= 1 (got \"", value, "\")"));
        }
        command_line.probe_batches.push_back(batch);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument \"", arg, "\""));
    }
  }
  if (!command_line.probe_batches.empty() && !command_line.probe) {
    return absl::InvalidArgumentError("--probe_batches: only meaningful with --probe");
  }
  return command_line;
}

void PrintLine(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// fitrun-worker --probe: prints the probe's header line (see memory_probe.h), then measures each
// batch of --probe_batches, or each batch size read from stdin (one per line, until end of input),
// printing one line per measurement as soon as it is done, so fitrund can decide what to measure
// next from what it has seen. Exits 0, or 2 when the spec cannot be probed or a measurement fails.
int RunProbe(const std::vector<int64_t>& batches) {
  const std::optional<std::string> path = GetEnv(fitrun::v1::launch::kAssignment);
  absl::Status status;
  if (!path.has_value() || path->empty()) {
    status = absl::InvalidArgumentError(absl::StrCat(fitrun::v1::launch::kAssignment, ": not set"));
  } else if (absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = LoadAssignment(*path); !assignment.ok()) {
    status = assignment.status();
  } else {
    // Never freed, as in Worker::Train: LibTorch keeps the installed allocator until exit. The
    // assignment's memory cap, if any, is the probe's budget.
    auto* counter = new CappedCpuAllocator(
        assignment->memory_cap_bytes_size() > 0 ? std::max<int64_t>(0, assignment->memory_cap_bytes(0)) : 0);
    absl::StatusOr<std::unique_ptr<MemoryProbe>> probe = MemoryProbe::Create(*assignment, counter);
    if (probe.ok()) {
      PrintLine(ProbeHeaderJson(**probe));
      // A batch past the budget is an answer (the caller measures smaller ones next); any other
      // failure ends the probe.
      auto measure = [&](int64_t batch) {
        absl::StatusOr<ProbePeak> peak = (*probe)->Measure(batch);
        PrintLine(peak.ok() ? ProbePeakJson(*peak) : ProbeErrorJson(batch, peak.status()));
        return absl::IsResourceExhausted(peak.status()) ? absl::OkStatus() : peak.status();
      };
      if (!batches.empty()) {
        for (int64_t batch : batches) {
          if (status = measure(batch); !status.ok()) break;
        }
      } else {
        std::string line;
        while (status.ok() && std::getline(std::cin, line)) {
          int64_t batch = 0;
          if (absl::StripAsciiWhitespace(line).empty()) continue;
          if (!absl::SimpleAtoi(line, &batch)) {
            status = absl::InvalidArgumentError(absl::StrCat("stdin: expected a batch size, got \"", line, "\""));
            break;
          }
          status = measure(batch);
        }
      }
      if (status.ok()) return kSuccess;
    } else {
      status = probe.status();
    }
  }
  std::fprintf(stderr, "fitrun-worker --probe: %s\n", std::string(status.message()).c_str());
  return kBadConfiguration;
}

}  // namespace
}  // namespace fitrun::worker

int main(int argc, char** argv) {
  using fitrun::worker::kBadConfiguration;
  absl::StatusOr<fitrun::worker::CommandLine> command_line = fitrun::worker::ParseCommandLine(argc, argv);
  if (!command_line.ok()) {
    std::fprintf(stderr,
                 "fitrun-worker: %s\n"
                 "usage: %s                              train one rank\n"
                 "       %s --probe [--probe_batches=B1,B2,...]  measure peak memory at micro-batch sizes\n"
                 "                         (without --probe_batches: one size per line on stdin)\n"
                 "Configured by the environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
                 "MASTER_PORT, FITRUN_ASSIGNMENT, and optionally FITRUN_COORDINATOR, FITRUN_JOB_ID,\n"
                 "FITRUN_ATTEMPT, FITRUN_JOB_TOKEN. The probe reads only FITRUN_ASSIGNMENT.\n",
                 std::string(command_line.status().message()).c_str(), argv[0], argv[0]);
    return kBadConfiguration;
  }
  if (command_line->probe) return fitrun::worker::RunProbe(command_line->probe_batches);
  absl::StatusOr<fitrun::worker::WorkerOptions> options =
      fitrun::worker::WorkerOptionsFromEnvironment(fitrun::worker::GetEnv);
  if (!options.ok()) {
    std::fprintf(stderr, "fitrun-worker: %s\n", std::string(options.status().message()).c_str());
    return kBadConfiguration;
  }
  fitrun::worker::Worker worker(*options);
  return worker.Run();
}
