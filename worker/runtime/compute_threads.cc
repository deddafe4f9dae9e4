#include "worker/runtime/compute_threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

namespace fitrun::worker {

void SetComputeThreads(int threads) {
  at::set_num_interop_threads(1);
  at::set_num_threads(threads);
  // Looked up rather than linked: a LibTorch on MKL or a single-threaded BLAS has no such function.
  using SetBlasThreads = void (*)(int);
  if (auto set_blas_threads = reinterpret_cast<SetBlasThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set_blas_threads(threads);
  }
}

}  // namespace fitrun::worker
