#ifndef FITRUN_WORKER_DDP_PROCESS_GROUP_H_
#define FITRUN_WORKER_DDP_PROCESS_GROUP_H_

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fitrun::worker {

// Which c10d backend carries the collectives; chosen from the device kind and the world size.
enum class CollectiveBackend {
  kGloo,        // CPU tensors; only in builds with USE_C10D_GLOO (a LibTorch that ships Gloo's headers)
  kNccl,        // CUDA tensors; only in builds with USE_C10D_NCCL (a CUDA LibTorch)
  kSingleRank,  // a CPU rank alone in its job: each collective is the identity; in every build
};

// The backend a rank uses: NCCL for a GPU of its own, Gloo for CPU ranks and for GPUs shared by
// several ranks of the job (NCCL refuses two ranks on one GPU), none to reach for a CPU rank alone.
CollectiveBackend BackendFor(bool on_cuda, bool shares_its_gpu, int world_size);

// OkStatus when this build of the worker has `backend`; otherwise Unimplemented, saying which build
// does. Lets a rank refuse its device before it loads data, as a configuration error.
absl::Status CollectiveBackendAvailable(CollectiveBackend backend);

// How a rank joins its job's process group (the torchrun contract plus the spec's timeout).
struct ProcessGroupOptions {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  // How long to wait for every rank to reach the store: ranks start at different times (process
  // start, loading the dataset), so this is kept longer than the collective timeout.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // Bounds every collective: a dead or stuck peer fails the rank instead of hanging it
  // (spec.ddp.collective_timeout_seconds).
  absl::Duration collective_timeout = absl::Seconds(60);
  CollectiveBackend backend = CollectiveBackend::kGloo;
  // Gloo's sum all-reduces through shared memory when every rank can map one segment (ranks on one
  // machine; worker/ddp/shared_memory_backend.h). Off (FITRUN_ALL_REDUCE=gloo): over Gloo's sockets,
  // as ranks on separate machines would be.
  bool shared_memory_all_reduce = true;
  // The store at master_addr:master_port is the launcher's (torchrun's agent store; fitrund's for a
  // local attempt): rank 0 connects to it as every rank does instead of hosting it.
  bool agent_store = false;
};

// Rendezvous through a c10d::TCPStore (rank 0 hosts it at master_addr:master_port, unless the launcher
// does: agent_store), waits until all
// ranks have joined, then builds the process group of the options' backend (kSingleRank: no
// rendezvous, CreateSingleRankProcessGroup). Fails with DeadlineExceeded when the peers do not show
// up within the rendezvous timeout.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> ConnectProcessGroup(
    const ProcessGroupOptions& options);

// An NCCL process group over an existing store. Unimplemented in builds without USE_C10D_NCCL.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateNcclProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, absl::Duration timeout);

// The group of a job's only rank: each collective leaves the rank's tensors as they are (their sum,
// average or broadcast over one rank) or copies them (an all-gather over one rank), finished at once.
// A CPU job of one rank needs no peers and no Gloo (which the CUDA pip wheels lack).
c10::intrusive_ptr<c10d::ProcessGroup> CreateSingleRankProcessGroup();

// A Gloo process group over an existing store (tests use a FileStore). `hostname` is the address the
// rank's Gloo device binds; ranks on one machine use the loopback address. With
// `shared_memory_all_reduce`, sums go through shared memory where every rank can map it (see
// ProcessGroupOptions). Unimplemented in builds without USE_C10D_GLOO.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, absl::Duration timeout,
    const std::string& hostname = "127.0.0.1", bool shared_memory_all_reduce = true);

// Overwrites every rank's parameters and buffers with rank 0's in one collective, so ranks start
// bitwise identical whatever their own initialization did. The flat buffer is built on the device of
// the module's state, so move the module to the rank's device first.
absl::Status BroadcastModuleState(c10d::ProcessGroup& group, const torch::nn::Module& module);

// Rank 0's `value` on every rank (e.g. the checkpoint step every rank must resume from). `device` is
// where the one-element tensor travels from: the rank's device, since NCCL only moves CUDA tensors.
absl::StatusOr<int64_t> BroadcastInt64(c10d::ProcessGroup& group, int64_t value, const at::Device& device);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_PROCESS_GROUP_H_
