#include "worker/programs/builtin_training.h"

#include <ATen/Parallel.h>
#ifdef FITRUN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/contract/launch_contract.h"
#include "worker/checkpoint/checkpoint_store.h"
#include "worker/data/dataset_cache.h"
#include "worker/data/sampler.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/c10d_optimizer_state_sharding.h"
#include "worker/ddp/process_group.h"
#include "worker/ddp/shared_memory_backend.h"
#include "worker/memory/caching_cpu_allocator.h"
#include "worker/memory/capped_allocator.h"
#include "worker/memory/oom_error.h"
#include "worker/memory/oom_message.h"
#include "worker/memory/process_gpu_memory.h"
#include "worker/models/model.h"
#include "worker/models/workload.h"
#include "worker/runtime/compute_threads.h"
#include "worker/torch_compat.h"
#include "worker/trainer/micro_batches.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {
namespace {

constexpr ExitCode kTrainingFailed = fitrun::contract::launch::kExitTrainingFailed;
constexpr ExitCode kBadConfiguration = fitrun::contract::launch::kExitBadConfiguration;

constexpr int kDefaultCollectiveTimeoutSeconds = 60;
constexpr absl::Duration kMinRendezvousTimeout = absl::Seconds(60);

#ifdef FITRUN_WITH_CUDA
struct CudaFreeAndTotal {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// The free and total memory of GPU `index` as the driver counts it (every process's use). Guarded:
// cudaMemGetInfo answers for the current device, which need not be this rank's.
absl::StatusOr<CudaFreeAndTotal> CudaMemoryInfo(c10::DeviceIndex index) {
  const c10::cuda::CUDAGuard guard(index);
  size_t free = 0;
  size_t total = 0;
  if (const cudaError_t error = cudaMemGetInfo(&free, &total); error != cudaSuccess) {
    (void)cudaGetLastError();  // a failed query must not be taken for a kernel's error later
    return absl::UnavailableError(absl::StrCat("cudaMemGetInfo(cuda:", static_cast<int>(index), "): ", cudaGetErrorString(error)));
  }
  return CudaFreeAndTotal{static_cast<int64_t>(free), static_cast<int64_t>(total)};
}

// The PCI bus id NVML knows GPU `index` by ("0000:17:00.0"); empty when CUDA cannot say.
std::string CudaPciBusId(c10::DeviceIndex index) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), index) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return id;
}

// The caching allocator's allocated (live and peak) and reserved (peak) bytes, and this process's
// whole footprint on the device now (`gauge`: NVML's figure for this process, context and libraries
// included; the whole device's used memory where NVML cannot say).
MemoryFigures CudaMemoryFigures(c10::DeviceIndex index, DeviceMemoryGauge* gauge) {
  const torch_compat::CudaDeviceStats stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const size_t aggregate = static_cast<size_t>(torch_compat::CudaStatType::AGGREGATE);
  MemoryFigures figures;
  figures.live_bytes = stats.allocated_bytes[aggregate].current;
  figures.peak_bytes = stats.allocated_bytes[aggregate].peak;
  figures.reserved_peak_bytes = stats.reserved_bytes[aggregate].peak;
  if (gauge != nullptr) figures.device_bytes = gauge->Sample();
  return figures;
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

// spec.ddp's communication hook; PowerSGD's knobs default as PyTorch's PowerSGDState when an
// assignment leaves them out (the coordinator fills them in).
CommHookOptions CommHookOptionsFor(const fitrun::v1::DdpSpec& ddp) {
  CommHookOptions options;
  switch (ddp.comm_hook()) {
    case fitrun::v1::COMM_HOOK_FP16: options.kind = CommHookOptions::Kind::kFp16; break;
    case fitrun::v1::COMM_HOOK_BF16: options.kind = CommHookOptions::Kind::kBf16; break;
    case fitrun::v1::COMM_HOOK_POWERSGD: options.kind = CommHookOptions::Kind::kPowerSgd; break;
    default: options.kind = CommHookOptions::Kind::kNone; break;
  }
  if (ddp.has_powersgd_rank()) options.powersgd_rank = ddp.powersgd_rank();
  if (ddp.has_powersgd_start_iter()) options.powersgd_start_iter = ddp.powersgd_start_iter();
  return options;
}

// "[fc3.bias fc3.weight fc2.bias fc2.weight] [fc1.bias fc1.weight]": the reducer's buckets in launch
// order, by parameter name, as PyTorch's DDP would show them.
std::string DescribeBuckets(const BucketedReducer& reducer, const torch::nn::Module& model) {
  std::vector<std::string> trained;
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad()) trained.push_back(item.key());
  }
  std::vector<std::string> buckets;
  for (const std::vector<int>& bucket : reducer.BucketLayout()) {
    std::vector<std::string> names;
    for (int index : bucket) names.push_back(index < static_cast<int>(trained.size()) ? trained[index] : "?");
    buckets.push_back(absl::StrCat("[", absl::StrJoin(names, " "), "]"));
  }
  return absl::StrJoin(buckets, " ");
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

// One rank of a built-in job, in its phases: the device, the data, the memory, the process group, the
// reducer and trainer, resuming, training. Errors before the rendezvous are the job's fault (exit 2);
// after it, training's (exit 1). Each phase returns the exit code to end with, or nullopt to go on.
class BuiltinTraining final : public TrainingProgram {
 public:
  explicit BuiltinTraining(const WorkerOptions& options) : options_(options) {}

  int Run(RankRuntime& runtime) override {
    runtime_ = &runtime;
    sink_ = &runtime.sink();
    // The phases turn what they expect to fail into Statuses; whatever LibTorch throws past them
    // still ends the rank through Fail (the device's memory running out as an OOM), not as an abort.
    try {
      for (const auto& phase : {&BuiltinTraining::UseAssignedDevice, &BuiltinTraining::LoadData,
                                &BuiltinTraining::SetUpMemory, &BuiltinTraining::JoinGroup,
                                &BuiltinTraining::BuildTrainer, &BuiltinTraining::ResumeOrDump}) {
        if (std::optional<int> exit = (this->*phase)(); exit.has_value()) return *exit;
      }
      return Train();
    } catch (const std::exception& e) {
      return Fail(kTrainingFailed, StatusFromTorchException(e, "fitrun-worker"));
    }
  }

 private:
  using Phase = std::optional<int>;

  // The assignment, this rank's device made current, the collective backend it needs, its threads.
  Phase UseAssignedDevice() {
    absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = LoadAssignment(options_.assignment_path);
    if (!assignment.ok()) return Fail(kBadConfiguration, assignment.status());
    if (absl::Status s = ValidateAssignment(*assignment, options_); !s.ok()) return Fail(kBadConfiguration, s);
    assignment_ = *std::move(assignment);
    absl::StatusOr<RankResources> resources = ResourcesOf(assignment_, options_.rank);
    if (!resources.ok()) return Fail(kBadConfiguration, resources.status());
    resources_ = *std::move(resources);
    absl::StatusOr<c10::Device> device = UseDevice(resources_.device, resources_.device_field, resources_.device_id);
    if (!device.ok()) return Fail(kBadConfiguration, device.status());
    device_ = *device;
    // NCCL refuses two ranks on one GPU (slices of it): such ranks talk over Gloo, as CPU ranks do
    // (BackendFor). A LibTorch without the backend a job needs (no Gloo in the CUDA pip wheel, for a
    // CPU job of several ranks) cannot run it: said now, as a configuration error, not after the data
    // has loaded.
    backend_ = BackendFor(device_.is_cuda(), SharesItsGpu(), options_.world_size);
    if (absl::Status s = CollectiveBackendAvailable(backend_); !s.ok()) {
      return Fail(kBadConfiguration,
                  absl::Status(s.code(), absl::StrCat(resources_.device_field, " is ", resources_.device_id,
                                                      SharesItsGpu() ? " (a GPU another rank shares)" : "", ": ",
                                                      s.message())));
    }
    SetComputeThreads(resources_.cpu_threads);
    return std::nullopt;
  }

  // Whether another rank of the plan runs on this rank's GPU (slices "cuda:N#k" of one GPU).
  bool SharesItsGpu() const {
    if (!device_.is_cuda()) return false;
    for (int r = 0; r < assignment_.plan().device_ids_size(); ++r) {
      if (r == options_.rank) continue;
      absl::StatusOr<PlanDevice> other = ParsePlanDevice(assignment_.plan().device_ids(r), "plan.device_ids");
      if (other.ok() && other->kind == PlanDevice::Kind::kCuda && other->index == resources_.device.index &&
          assignment_.plan().device_ids(r).find('/') == std::string::npos) {
        return true;
      }
    }
    return false;
  }

  // The workload (through the dataset cache) and the trainer's options for it.
  Phase LoadData() {
    const absl::Time load_start = absl::Now();
    DatasetCache dataset_cache(
        {assignment_.dataset_cache_dir(), [this](const std::string& line) { sink_->OnLog(line); }});
    absl::StatusOr<Workload> workload = LoadWorkload(assignment_.spec(), /*with_test=*/options_.rank == 0, &dataset_cache);
    if (!workload.ok()) return Fail(kBadConfiguration, workload.status());
    workload_ = *std::move(workload);
    trainer_options_ = TrainerOptionsFor(assignment_, options_);
    trainer_options_.device = device_;
    if (absl::Status s = ValidateTrainerOptions(trainer_options_, workload_.train.size()); !s.ok()) {
      return Fail(kBadConfiguration, s);
    }
    sink_->OnLog(absl::StrCat("rank ", options_.rank, "/", options_.world_size, " on ", resources_.device_id,
                              ": model ", workload_.description, ", ", workload_.train.size(),
                              " training samples loaded in ", absl::FormatDuration(absl::Now() - load_start),
                              ", per-device batch ", trainer_options_.per_device_batch, " x ",
                              trainer_options_.grad_accum_steps, " accumulation, lr ", trainer_options_.learning_rate,
                              ", ", trainer_options_.total_steps, " steps, ", resources_.cpu_threads, " threads"));
    return std::nullopt;
  }

  // The device's memory: a virtual CPU device's cap enforced by the capped allocator (the model's
  // state moved into it); on a GPU the model moved there, a slice's cap set on the caching allocator,
  // and its figures stamped on every progress report.
  Phase SetUpMemory() {
    trainer_sink_ = sink_;
    const int64_t cap = resources_.memory_cap_bytes;
    // A CPU device's tensors come from a cache of freed blocks: every step asks for the sizes the
    // one before it freed (see caching_cpu_allocator.h).
    if (cap <= 0 && device_.is_cpu()) RankHostBlockCache()->Install();
    if (cap > 0 && device_.is_cpu()) {
      // Never freed: LibTorch keeps the installed allocator for the rest of the process, and other
      // threads may allocate through it until exit. The training data loaded above is host data
      // and stays uncounted, as the estimator leaves it out.
      memory_ = new CappedCpuAllocator(cap, RankHostBlockCache());
      memory_->Install();
      try {
        MoveModuleStateIntoAllocator(*workload_.model);
      } catch (const std::exception& e) {
        return Fail(kBadConfiguration,
                    StatusFromTorchException(e, absl::StrCat("moving the model's state into the ", cap, "-byte cap")));
      }
      trainer_options_.exhaust_memory = [memory = memory_] {
        // More than the cap leaves: the capped allocator refuses it, exactly as a full device would.
        const int64_t beyond = memory->cap_bytes() - memory->Live() + (1LL << 20);
        (void)torch::empty({beyond}, torch::kUInt8);
      };
      memory_sink_ = std::make_unique<MemoryStampingSink>(
          sink_, [memory = memory_] { return MemoryFigures{memory->Live(), memory->Peak()}; });
      trainer_sink_ = memory_sink_.get();
      sink_->OnLog(absl::StrCat("memory cap ", cap, " bytes enforced; model state ", memory_->Live(), " bytes"));
    }
    if (device_.is_cpu()) return std::nullopt;
    // Parameters and buffers move before the broadcast, the reducer and the optimizer see them.
    try {
      workload_.model->to(device_);
    } catch (const std::exception& e) {
      return Fail(kBadConfiguration, StatusFromTorchException(e, absl::StrCat("moving the model to ", device_.str())));
    }
#ifdef FITRUN_WITH_CUDA
    if (device_.is_cuda()) {
      const c10::DeviceIndex index = device_.index();
      const int64_t total = static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
      // A slice: its cap binds the caching allocator (the allocator's per-process limit); a whole
      // GPU's limit is the device itself.
      const int64_t limit = cap > 0 ? cap : total;
      if (cap > 0) {
        c10::cuda::CUDACachingAllocator::setMemoryFraction(
            std::min(1.0, static_cast<double>(cap) / static_cast<double>(total)), index);
      }
      trainer_options_.exhaust_memory = [index, limit] {
        // More than the limit: the caching allocator refuses it with a real OutOfMemoryError.
        (void)torch::empty({limit + (1LL << 20)}, torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, index));
      };
      // This process's own footprint on its GPU, from NVML when the driver has it: the whole device's
      // used memory would count every other process on a shared GPU.
      absl::StatusOr<std::unique_ptr<NvmlProcessMemory>> nvml = NvmlProcessMemory::Create({});
      if (nvml.ok()) {
        nvml_ = *std::move(nvml);
      } else {
        sink_->OnLog(absl::StrCat("device memory: NVML unavailable (", nvml.status().message(),
                                  "); reporting the whole device's used memory"));
      }
      device_gauge_ = std::make_unique<DeviceMemoryGauge>(
          nvml_.get(), CudaPciBusId(index), static_cast<int64_t>(getpid()), [index]() -> absl::StatusOr<int64_t> {
            absl::StatusOr<CudaFreeAndTotal> info = CudaMemoryInfo(index);
            if (!info.ok()) return info.status();
            return info->total_bytes - info->free_bytes;
          });
      memory_sink_ = std::make_unique<MemoryStampingSink>(
          sink_, [index, gauge = device_gauge_.get()] { return CudaMemoryFigures(index, gauge); });
      trainer_sink_ = memory_sink_.get();
      PlaceTrainingSet(cap);
      sink_->OnLog(absl::StrCat("model on ", device_.str(), cap > 0 ? absl::StrCat("; slice of ", cap, " bytes: the caching allocator's limit") : "",
                                ", PYTORCH_CUDA_ALLOC_CONF=", std::getenv("PYTORCH_CUDA_ALLOC_CONF") != nullptr
                                                                   ? std::getenv("PYTORCH_CUDA_ALLOC_CONF")
                                                                   : "(unset)"));
    }
#endif
    return std::nullopt;
  }

#ifdef FITRUN_WITH_CUDA
  // On a GPU, the training set (and rank 0's test set) goes where the plan left room for it: the
  // device, so that no step waits for the host, or else pinned host memory, prefetched.
  void PlaceTrainingSet(int64_t slice_cap_bytes) {
    const fitrun::v1::Plan& plan = assignment_.plan();
    int64_t room = 0;
    if (slice_cap_bytes > 0) {
      room = slice_cap_bytes - plan.predicted().allocator_bytes();  // a slice binds the allocator only
    } else if (plan.usable_bytes() > 0) {
      room = plan.usable_bytes() - plan.predicted().total_bytes();
    } else if (absl::StatusOr<CudaFreeAndTotal> info = CudaMemoryInfo(device_.index()); info.ok()) {
      room = info->free_bytes;  // a plan without figures: what the device has free now
    }
    const int64_t bytes =
        DatasetBytes(workload_.train) + (workload_.test.has_value() ? DatasetBytes(*workload_.test) : 0);
    trainer_options_.data_placement = ChooseDataPlacement(device_, bytes, room);
    sink_->OnLog(absl::StrCat("training data (", bytes, " bytes) in ",
                              DataPlacementName(trainer_options_.data_placement), "; the plan leaves ", room,
                              " bytes of the device"));
  }
#endif

  // The rendezvous and rank 0's parameters, broadcast.
  Phase JoinGroup() {
    const fitrun::v1::JobSpec& spec = assignment_.spec();
    const int timeout_seconds = spec.ddp().collective_timeout_seconds() > 0 ? spec.ddp().collective_timeout_seconds()
                                                                            : kDefaultCollectiveTimeoutSeconds;
    ProcessGroupOptions group_options;
    group_options.master_addr = options_.master_addr;
    group_options.master_port = options_.master_port;
    group_options.agent_store = options_.agent_store;
    group_options.rank = options_.rank;
    group_options.world_size = options_.world_size;
    group_options.collective_timeout = absl::Seconds(timeout_seconds);
    group_options.rendezvous_timeout = std::max(absl::Seconds(timeout_seconds), kMinRendezvousTimeout);
    group_options.backend = backend_;
    group_options.shared_memory_all_reduce = options_.shared_memory_all_reduce;
    if (!assignment_.checkpoint_dir().empty()) {
      absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Create(
          {assignment_.checkpoint_dir(), spec.checkpoint().keep_last() > 0 ? spec.checkpoint().keep_last() : 2});
      if (!store.ok()) return Fail(kBadConfiguration, store.status());
      checkpoints_ = *std::move(store);
      trainer_options_.checkpoints = checkpoints_.get();
    }
    const absl::Time join_start = absl::Now();
    absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group = ConnectProcessGroup(group_options);
    if (!group.ok()) return Fail(kTrainingFailed, group.status());
    group_ = *std::move(group);
    if (absl::Status s = BroadcastModuleState(*group_, *workload_.model); !s.ok()) return Fail(kTrainingFailed, s);
    sink_->OnLog(absl::StrCat("joined the process group at ", options_.master_addr, ":", options_.master_port, " in ",
                              absl::FormatDuration(absl::Now() - join_start),
                              SumsInSharedMemory(*group_) ? " (sums through shared memory)" : "", "; parameters ",
                              ParameterChecksum(*workload_.model), " after rank 0's broadcast"));
    return std::nullopt;
  }

  // The gradient reducer (buckets, the communication hook) and the trainer over it.
  Phase BuildTrainer() {
    const fitrun::v1::JobSpec& spec = assignment_.spec();
    BucketedReducer::Options bucket_options;
    if (spec.ddp().bucket_cap_mb() > 0) {
      bucket_options.bucket_cap_bytes = static_cast<int64_t>(spec.ddp().bucket_cap_mb() * (1 << 20));
    }
    bucket_options.comm_hook = CommHookOptionsFor(spec.ddp());
    absl::StatusOr<std::unique_ptr<BucketedReducer>> synchronizer =
        BucketedReducer::Create(group_, workload_.model->parameters(), bucket_options);
    if (!synchronizer.ok()) {
      return Fail(synchronizer.status().code() == absl::StatusCode::kInvalidArgument ? kBadConfiguration
                                                                                      : kTrainingFailed,
                  synchronizer.status());
    }
    synchronizer_ = *std::move(synchronizer);
    sink_->OnLog(absl::StrCat("ddp: ", synchronizer_->BucketLayout().size(), " buckets ",
                              DescribeBuckets(*synchronizer_, *workload_.model), ", comm hook ",
                              synchronizer_->CommHookDescription()));
    if (assignment_.plan().zero_stage() == 1 && options_.world_size > 1) {
      absl::StatusOr<std::unique_ptr<C10dOptimizerStateSharding>> sharding =
          C10dOptimizerStateSharding::Create(group_, workload_.model->parameters());
      if (!sharding.ok()) return Fail(kBadConfiguration, sharding.status());
      sharding_ = *std::move(sharding);
      trainer_options_.optimizer_state_sharding = sharding_.get();
      int64_t owned = 0;
      int64_t total = 0;
      const std::vector<at::Tensor> parameters = workload_.model->parameters();
      for (size_t i = 0; i < parameters.size(); ++i) {
        total += parameters[i].numel();
        if (sharding_->owners()[i] == options_.rank) owned += parameters[i].numel();
      }
      sink_->OnLog(absl::StrCat("optimizer states sharded over ", options_.world_size, " ranks (zero stage 1): this rank "
                                "keeps and steps ", owned, " of ", total, " parameters' states"));
    }
    train_size_ = workload_.train.size();
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(trainer_options_, workload_.model, std::move(workload_.train), std::move(workload_.test),
                        synchronizer_.get(), trainer_sink_);
    if (!trainer.ok()) {
      return Fail(trainer.status().code() == absl::StatusCode::kInvalidArgument ? kBadConfiguration : kTrainingFailed,
                  trainer.status());
    }
    trainer_ = *std::move(trainer);
    return std::nullopt;
  }

  // From the last checkpoint, if there is one; rank 0's initial state for the parity test, if asked.
  Phase ResumeOrDump() {
    if (checkpoints_ != nullptr) {
      if (absl::Status s = Resume(*group_, *checkpoints_, *trainer_, *workload_.model); !s.ok()) {
        return Fail(kTrainingFailed, s);
      }
    }
    if (!options_.initial_state_dump_dir.empty() && options_.rank == 0) {
      const TrainerOptions& o = trainer_->options();
      const int64_t epochs = (o.total_steps + o.steps_per_epoch - 1) / o.steps_per_epoch;
      if (absl::Status s = DumpInitialState(options_.initial_state_dump_dir, *workload_.model, train_size_, o.seed, epochs);
          !s.ok()) {
        return Fail(kBadConfiguration, s);
      }
    }
    return std::nullopt;
  }

  // The loop, with the stop command wired to it; how it ended becomes the exit code.
  int Train() {
    RankRuntime& runtime = *runtime_;
    if (!runtime.stop().Attach([trainer = trainer_.get()](const std::string&) { trainer->RequestStop(); })) {
      return runtime.Stopped();
    }
    absl::StatusOr<TrainResult> result = trainer_->Run();
    runtime.stop().Attach(nullptr);
    if (!result.ok()) {
      if (result.status().code() == absl::StatusCode::kCancelled && runtime.stop().stopped()) return runtime.Stopped();
      if (result.status().code() == absl::StatusCode::kResourceExhausted) {
        return OutOfMemory(trainer_->current_step(), trainer_options_.per_device_batch, result.status());
      }
      if (IsCollectiveFailure(result.status()) && runtime.StoppedMeanwhile()) {
        runtime.console().OnLog(absl::StrCat("collective failed while stopping: ", result.status().message()));
        return runtime.Stopped();
      }
      return Fail(kTrainingFailed, result.status());
    }
    LogCommunication(*synchronizer_, *result, trainer_->start_step(), trainer_options_);
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
        // Out of memory is no damaged file: an older checkpoint would not fit either.
        if (absl::IsResourceExhausted(s)) return s;
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
  // time the training thread spent on gradient communication that backward did not hide: the
  // collectives it ran itself (a sum through shared memory runs on it, inside backward's hooks) or
  // started, and its waits for the rest.
  void LogCommunication(const BucketedReducer& reducer, const TrainResult& result, int64_t start_step,
                        const TrainerOptions& o) {
    const BucketedReducer::CommStats stats = reducer.comm_stats();
    const double exposed = absl::ToDoubleSeconds(stats.exposed());
    const double samples = static_cast<double>(result.steps - start_step) * o.per_device_batch *
                           o.grad_accum_steps * o.world_size;
    sink_->OnLog(absl::StrFormat(
        "communication: %d buckets, exposed %.3f s over %d steps = %.1f%% of %.3f s training (collectives "
        "run or started on the training thread %.3f s, all-reduce wait %.3f s); %.1f samples/s (all ranks); "
        "comm hook %s",
        static_cast<int>(reducer.BucketLayout().size()), exposed, stats.synchronized_steps,
        result.train_seconds > 0 ? 100.0 * exposed / result.train_seconds : 0.0, result.train_seconds,
        absl::ToDoubleSeconds(stats.start_time), absl::ToDoubleSeconds(stats.wait_time),
        result.train_seconds > 0 ? samples / result.train_seconds : 0.0, reducer.CommHookDescription()));
  }
  int Finish(const TrainResult& result) {
    std::string summary = absl::StrCat("finished ", result.steps, " steps in ",
                                       absl::FormatDuration(absl::Seconds(result.train_seconds)),
                                       ": final loss ", result.final_loss, ", parameter checksum ",
                                       result.parameter_checksum);
    if (result.has_test_accuracy) absl::StrAppend(&summary, ", test accuracy ", result.test_accuracy);
    fitrun::v1::RankFinished finished;
    finished.set_steps(result.steps);
    finished.set_final_loss(result.final_loss);
    finished.set_parameter_checksum(result.parameter_checksum);
    finished.set_has_test_accuracy(result.has_test_accuracy);
    finished.set_test_accuracy(result.test_accuracy);
    finished.set_train_seconds(result.train_seconds);
    finished.mutable_metrics()->insert(result.test_metrics.begin(), result.test_metrics.end());
    if (memory_ != nullptr) finished.set_peak_bytes(memory_->Peak());
#ifdef FITRUN_WITH_CUDA
    if (device_.is_cuda()) {
      const MemoryFigures figures = CudaMemoryFigures(device_.index(), device_gauge_.get());  // a last sample
      finished.set_peak_bytes(figures.peak_bytes);
      finished.set_reserved_peak_bytes(figures.reserved_peak_bytes);
      // The highest sample of the run (one per progress report), not this last one.
      if (device_gauge_ != nullptr) {
        finished.set_device_peak_bytes(device_gauge_->peak());
        runtime_->console().OnLog(absl::StrCat("device memory peak ", device_gauge_->peak(), " bytes: ",
                                               device_gauge_->Describe()));
      }
    }
#endif
    return runtime_->Finish(finished, summary);
  }

  // How a phase ends the rank when it fails: the device's memory running out (ResourceExhausted,
  // wherever it came from: moving the model, the buckets, a hook, a step) as an OOM, exit 3;
  // anything else with `code`.
  int Fail(ExitCode code, const absl::Status& status) {
    if (absl::IsResourceExhausted(status)) {
      return OutOfMemory(trainer_ != nullptr ? trainer_->current_step() : 0, trainer_options_.per_device_batch,
                         status);
    }
    return runtime_->Fail(code, status);
  }


  // The device's cap was hit: the OutOfMemory event carries what the coordinator needs to replan
  // (the request refused, what was live then, the batch), and goes out before the RankFailed. On a
  // CUDA device the caching allocator's counters give live and peak and the device's total memory
  // is the cap; the refused request is only in the error's text and is left 0. Without either, the
  // bytes stay 0 and the batch alone tells the coordinator what not to plan again.
  int OutOfMemory(int64_t step, int64_t per_device_batch, const absl::Status& status) {
    fitrun::v1::OutOfMemory oom;
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
        const MemoryFigures figures = CudaMemoryFigures(device_.index(), /*gauge=*/nullptr);
        const int64_t total = static_cast<int64_t>(at::cuda::getDeviceProperties(device_.index())->totalGlobalMem);
        oom.set_live_bytes(figures.live_bytes);
        oom.set_peak_bytes(figures.peak_bytes);
        oom.set_cap_bytes(resources_.memory_cap_bytes > 0 ? resources_.memory_cap_bytes : total);
        oom.set_requested_bytes(RequestedBytesInOutOfMemory(std::string(status.message())));
        const torch_compat::CudaDeviceStats stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
        oom.set_reserved_bytes(stats.reserved_bytes[static_cast<size_t>(torch_compat::CudaStatType::AGGREGATE)].current);
        // The whole device's, as the driver saw it: what other processes left is part of why.
        if (absl::StatusOr<CudaFreeAndTotal> info = CudaMemoryInfo(device_.index()); info.ok()) {
          oom.set_device_free_bytes(info->free_bytes);
        }
        oom.set_device_total_bytes(total);
      } catch (const std::exception& e) {
        runtime_->console().OnLog(absl::StrCat("reading CUDA memory statistics: ", e.what()));
      }
    }
#endif
    return runtime_->OutOfMemory(oom, status);
  }

  static bool IsCollectiveFailure(const absl::Status& status) {
    return status.code() == absl::StatusCode::kUnavailable ||
           status.code() == absl::StatusCode::kDeadlineExceeded;
  }

  const WorkerOptions options_;
  RankRuntime* runtime_ = nullptr;
  ProgressSink* sink_ = nullptr;
  // What the phases build, in order.
  fitrun::v1::WorkerAssignment assignment_;
  RankResources resources_;
  c10::Device device_ = c10::Device(c10::kCPU);  // this rank's (plan.device_ids[rank])
  CollectiveBackend backend_ = CollectiveBackend::kGloo;
  Workload workload_;
  TrainerOptions trainer_options_;
  CappedCpuAllocator* memory_ = nullptr;  // see SetUpMemory(): deliberately never freed
  std::unique_ptr<MemoryStampingSink> memory_sink_;
  // On a GPU: NVML (null where the driver's library is missing) and this rank's footprint from it.
  std::unique_ptr<NvmlProcessMemory> nvml_;
  std::unique_ptr<DeviceMemoryGauge> device_gauge_;
  ProgressSink* trainer_sink_ = nullptr;  // progress stamped with the device's memory where it is counted
  std::unique_ptr<CheckpointStore> checkpoints_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::unique_ptr<BucketedReducer> synchronizer_;
  std::unique_ptr<C10dOptimizerStateSharding> sharding_;
  int64_t train_size_ = 0;
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace

std::unique_ptr<TrainingProgram> MakeBuiltinTraining(const WorkerOptions& options) {
  return std::make_unique<BuiltinTraining>(options);
}

}  // namespace fitrun::worker
