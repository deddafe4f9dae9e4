// Every difference between the LibTorch versions fitrun-worker builds against, in one place, so
// that the rest of the worker has no version #ifs: Debian's LibTorch 1.13 (CPU, with Gloo: the
// default build, the one the tests run) and a 2.x CUDA LibTorch (the GPU machines: the PyTorch
// 2.11 pip wheel's). Keyed on TORCH_VERSION_MAJOR/MINOR (torch/version.h) where PyTorch's release
// that changed the API is known, on a header's presence where that is the exact test.
//
// Checked: 1.13 by the Bazel build and tests; 2.11 by //worker:libtorch_2_11_syntax_test, which
// compiles every worker source against 2.11's headers with CUDA and NCCL on and Gloo off, and by
// tools/gpu/worker_tests.sh, which builds the worker and its tests with CMake against the 2.11 CUDA
// wheel and runs them on CPU (tools/test.sh's full tier). Releases
// between them take the 2.x branches and have not been compiled: ProcessGroupOver is written
// against 2.11's c10d::ProcessGroup, and another 2.x may need a branch of its own there.
//
// What differs, and what here handles it:
//  - c10::Allocator::allocate is const in 1.13 and not from 2.3, which also made copy_data pure
//    virtual: allocators derive from CpuAllocatorBase and implement AllocateBlock.
//  - c10d's backends (ProcessGroupGloo, ProcessGroupNCCL) are c10d::ProcessGroups in 1.13 and
//    c10d::Backends in 2.x, where a ProcessGroup dispatches each collective to the backend set for
//    the tensors' device type and reports its default backend's name (the fp16/bf16 hooks ask for
//    "nccl"): backends are made as C10dBackend and used through ProcessGroupOver.
//  - The CUDA caching allocator's statistics types moved from c10::cuda::CUDACachingAllocator to
//    c10::CachingDeviceAllocator (c10/core/CachingDeviceAllocator.h): CudaStatType, CudaDeviceStats.
//  - torch::optim::Optimizer::state() is keyed by the parameter's TensorImpl address as a string in
//    1.13 and as the pointer itself in 2.x: OptimizerStateKey.
//  - 2.x has the optimizers' fused kernels (at::_fused_sgd_, _fused_adam_, _fused_adamw_: one kernel
//    for all of a group's parameters, on CUDA and CPU); 1.13 has none, and torch::optim has no
//    `fused` option in either: HasFusedOptimizerKernels, FusedSgdStep, FusedAdamStep.
//  - 2.x has at::scaled_dot_product_attention (flash and memory-efficient kernels that never hold
//    the attention map); 1.13 has not: ScaledDotProductCausalAttention.
// What needs no shim, only a spelling or a build setting that holds in both:
//  - at::NoGradGuard is declared in <ATen/core/grad_mode.h>, which <ATen/ATen.h> includes in 1.13
//    and not in 2.x: include it where the guard is used.
//  - The pip wheel ships no Gloo headers (gloo/*.h), so ProcessGroupGloo.hpp cannot be compiled
//    there. third_party/libtorch/libtorch.bzl defines USE_C10D_GLOO only where Gloo's headers are,
//    as it defines USE_C10D_NCCL and FITRUN_WITH_CUDA only for a LibTorch with libtorch_cuda.so
//    (worker/CMakeLists.txt likewise, and takes USE_C10D_GLOO off the torch_cpu target, which
//    defines it for every user of a LibTorch built with Gloo);
//    code that needs a backend itself tests those macros (worker/ddp/process_group.cc), and a
//    worker without Gloo refuses a job of several CPU ranks, or of ranks sharing a GPU, with a
//    configuration error instead of failing to link (a CPU rank alone needs no backend).
//  - A 2.x LibTorch's include/ carries protobuf 3.13's headers; the worker's protos and gRPC are
//    Debian's protobuf 3.21, whose headers must win: libtorch.bzl and worker/CMakeLists.txt leave
//    include/google out, and the syntax test puts Debian's first.
//
// Kept light (libfitrun_memory.so, preloaded into every script rank, includes it through the
// capped allocator): c10d's classes are only declared here, and ProcessGroupOver is defined in
// torch_compat.cc. The tensor ops below are defined in torch_compat_ops.cc, which only the worker
// links (//worker:torch_compat_ops).

#ifndef FITRUN_WORKER_TORCH_COMPAT_H_
#define FITRUN_WORKER_TORCH_COMPAT_H_

#include <c10/core/Allocator.h>
#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#ifdef FITRUN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <c10/core/CachingDeviceAllocator.h>
#define FITRUN_CACHING_DEVICE_ALLOCATOR 1
#endif
#endif

#define FITRUN_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace at {
class Tensor;
}  // namespace at

namespace c10d {
class Backend;
class ProcessGroup;
class Store;
}  // namespace c10d

namespace fitrun::worker::torch_compat {

// A CPU allocator with one signature in every version. Subclasses implement AllocateBlock, const
// as 1.13's allocate was (their state lives in atomics, shared with the deleters).
class CpuAllocatorBase : public c10::Allocator {
 public:
  virtual c10::DataPtr AllocateBlock(size_t n) const = 0;

#if FITRUN_TORCH_VERSION_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) final { return AllocateBlock(n); }
  // Blocks are host memory addressed by their data pointers, as LibTorch's own CPU allocator's.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const final { return AllocateBlock(n); }
#endif
};

// What c10d's backends (ProcessGroupGloo, ProcessGroupNCCL) are.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// The process group the worker's collectives go through, carried by `backend` for tensors on
// `device_type` (Gloo for kCPU, NCCL for kCUDA) and named after it. In 1.13 that is the backend
// itself; in 2.x a c10d::ProcessGroup over `store` with `backend` as its default.
c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupOver(c10::intrusive_ptr<C10dBackend> backend,
                                                        const c10::intrusive_ptr<c10d::Store>& store,
                                                        c10::DeviceType device_type);

// The backend that carries `group`'s collectives on `device_type`'s tensors: the group itself in
// 1.13, the backend ProcessGroupOver set for that device type in 2.x. Owned by the group.
C10dBackend* BackendOf(c10d::ProcessGroup& group, c10::DeviceType device_type);

// The key of a parameter's entry in torch::optim::Optimizer::state().
#if TORCH_VERSION_MAJOR >= 2
using OptimizerStateKeyType = void*;
#else
using OptimizerStateKeyType = std::string;
#endif
OptimizerStateKeyType OptimizerStateKey(const at::Tensor& parameter);

// Whether this LibTorch has the fused optimizer kernels (2.x). Without them the two functions below
// throw c10::Error.
bool HasFusedOptimizerKernels();

// One step of SGD over `parameters` in one kernel, as torch::optim::SGD's step computes it (weight
// decay added to the gradient, then momentum without dampening or Nesterov), up to rounding.
// `momentum_buffers` (empty when momentum is 0) are overwritten with the gradients on the first step.
void FusedSgdStep(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& gradients,
                  const std::vector<at::Tensor>& momentum_buffers, double lr, double momentum, double weight_decay,
                  bool first_step);

// One step of Adam (`decoupled_weight_decay`: AdamW) over `parameters` in one kernel, as
// torch::optim::Adam and AdamW compute it, up to rounding, at the optimizer step `step` (already
// counted: 1 on the first). The moments are updated in place.
void FusedAdamStep(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& gradients,
                   const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs, int64_t step,
                   double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled_weight_decay);

// Causal attention over heads: q, k and v are [B, heads, T, head_dim], the result too. 2.x's
// scaled_dot_product_attention where LibTorch has it (its kernels do not materialise the T x T
// scores, and under autocast they run in 16 bits), else softmax(q k^T / sqrt(head_dim)) v written out
// with the future masked. The two agree within float rounding.
at::Tensor ScaledDotProductCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

#ifdef FITRUN_WITH_CUDA
// The CUDA caching allocator's statistics (getDeviceStats) and the index into each of their arrays.
#ifdef FITRUN_CACHING_DEVICE_ALLOCATOR
using CudaDeviceStats = c10::CachingDeviceAllocator::DeviceStats;
using CudaStatType = c10::CachingDeviceAllocator::StatType;
#else
using CudaDeviceStats = c10::cuda::CUDACachingAllocator::DeviceStats;
using CudaStatType = c10::cuda::CUDACachingAllocator::StatType;
#endif
#endif  // FITRUN_WITH_CUDA

}  // namespace fitrun::worker::torch_compat

#endif  // FITRUN_WORKER_TORCH_COMPAT_H_
