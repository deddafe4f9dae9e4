// How many threads a rank's compute uses, set in one place for every library that keeps a pool.
#ifndef FITRUN_WORKER_RUNTIME_COMPUTE_THREADS_H_
#define FITRUN_WORKER_RUNTIME_COMPUTE_THREADS_H_

namespace fitrun::worker {

// LibTorch's intra-op threads (`threads`) and inter-op threads (one), and, where LibTorch's BLAS is
// a threaded OpenBLAS (Debian's), OpenBLAS's own pool, which at::set_num_threads does not reach.
// fitrund also sets OPENBLAS_NUM_THREADS when it starts a rank (launch_contract.h's kOpenBlasThreads),
// which OpenBLAS reads once as it loads and which does more (measured: the cnn at 1,550-1,610
// samples/s over two ranks against 1,430-1,530 with the call here alone); the call covers a warm
// rank, started with one thread before its job said how many.
void SetComputeThreads(int threads);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_RUNTIME_COMPUTE_THREADS_H_
