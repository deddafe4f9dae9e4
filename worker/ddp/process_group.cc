#include "worker/ddp/process_group.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
// Each backend only where the LibTorch ships it (third_party/libtorch/libtorch.bzl sets the macros).
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
// ProcessGroupNCCL's layout depends on the NCCL version: the nccl.h the compiler found must be the one
// worker/CMakeLists.txt checked against LibTorch's NCCL, not another one earlier on the include path.
#if defined(FITRUN_NCCL_VERSION_CODE) && NCCL_VERSION_CODE != FITRUN_NCCL_VERSION_CODE
#error "nccl.h is not the NCCL version LibTorch was built with (see worker/CMakeLists.txt)"
#endif
#endif

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/ddp/c10d_status.h"
#include "worker/ddp/shared_memory_backend.h"
#include "worker/torch_compat.h"

namespace fitrun::worker {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Whether something accepts TCP connections at host:port now.
bool Accepting(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool accepted = false;
  for (addrinfo* a = found; a != nullptr && !accepted; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    accepted = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(found);
  return accepted;
}

// LibTorch 1.13's store client sleeps a whole second before retrying a refused connection, and the
// ranks start together, so rank 0's store is rarely up at a peer's first try: a peer waits for it
// here, every 5 ms, and its client then connects at once. Gives up silently at `deadline` and lets
// the client report.
void WaitUntilAccepting(const std::string& host, int port, absl::Time deadline) {
  while (!Accepting(host, port) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
}

// The collectives the worker issues, for a group of one rank (CreateSingleRankProcessGroup).
class SingleRankBackend final : public torch_compat::C10dBackend {
 public:
  SingleRankBackend() : torch_compat::C10dBackend(/*rank=*/0, /*size=*/1) {}

  const std::string getBackendName() const override { return "single-rank"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& /*opts*/) override {
    return Done(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& /*opts*/) override {
    return Done(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "all-gather: one output list per input");
    std::vector<at::Tensor> gathered;
    for (size_t i = 0; i < inputs.size(); ++i) {
      TORCH_CHECK(outputs[i].size() == 1, "a group of one rank gathers one tensor per input");
      outputs[i][0].copy_(inputs[i]);
      gathered.push_back(outputs[i][0]);
    }
    return Done(gathered);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override { return Done({}); }

 private:
  static c10::intrusive_ptr<c10d::Work> Done(const std::vector<at::Tensor>& tensors) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    future->markCompleted(c10::IValue(tensors));
    return c10d::Work::create_from_future(future);
  }
};

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> CreateSingleRankProcessGroup() {
  return torch_compat::ProcessGroupOver(c10::make_intrusive<SingleRankBackend>(), c10::make_intrusive<c10d::HashStore>(),
                                        c10::kCPU);
}

CollectiveBackend BackendFor(bool on_cuda, bool shares_its_gpu, int world_size) {
  if (on_cuda && !shares_its_gpu) return CollectiveBackend::kNccl;
  return world_size == 1 && !on_cuda ? CollectiveBackend::kSingleRank : CollectiveBackend::kGloo;
}

absl::Status CollectiveBackendAvailable(CollectiveBackend backend) {
  switch (backend) {
    case CollectiveBackend::kGloo:
#ifdef USE_C10D_GLOO
      return absl::OkStatus();
#else
      return absl::UnimplementedError(
          "several CPU ranks, or ranks sharing a GPU, talk over Gloo, and this fitrun-worker was built "
          "against a LibTorch without Gloo's headers (as the CUDA pip wheel's): give the job one CPU rank "
          "(resources.max_devices: 1) or a GPU per rank, or run it with a worker built against Debian's "
          "LibTorch");
#endif
    case CollectiveBackend::kNccl:
#ifdef USE_C10D_NCCL
      return absl::OkStatus();
#else
      return absl::UnimplementedError(
          "NCCL needs a CUDA build of fitrun-worker (LIBTORCH_HOME pointing at a LibTorch with "
          "libtorch_cuda.so)");
#endif
    case CollectiveBackend::kSingleRank:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown collective backend");
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateNcclProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, absl::Duration timeout) {
#ifdef USE_C10D_NCCL
  try {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = ToChrono(timeout);
    return torch_compat::ProcessGroupOver(
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options), store, c10::kCUDA);
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, absl::StrCat("creating the NCCL process group (rank ", rank, " of ",
                                         world_size, ")"));
  }
#else
  (void)store;
  (void)timeout;
  return absl::UnimplementedError(absl::StrCat(
      "rank ", rank, " of ", world_size, ": ", CollectiveBackendAvailable(CollectiveBackend::kNccl).message()));
#endif
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, absl::Duration timeout,
    const std::string& hostname, bool shared_memory_all_reduce) {
#ifdef USE_C10D_GLOO
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(ToChrono(timeout));
    options->devices.push_back(IsLoopback(hostname)
                                   ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    // One Gloo thread: collectives are issued one at a time and the cores belong to compute.
    options->threads = 1;
    c10::intrusive_ptr<torch_compat::C10dBackend> backend =
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
    if (shared_memory_all_reduce) backend = WithSharedMemoryAllReduce(std::move(backend), store, rank, world_size, timeout);
    return torch_compat::ProcessGroupOver(std::move(backend), store, c10::kCPU);
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, absl::StrCat("creating the Gloo process group (rank ", rank, " of ",
                                         world_size, ")"));
  }
#else
  (void)store;
  (void)timeout;
  (void)hostname;
  (void)shared_memory_all_reduce;
  return absl::UnimplementedError(absl::StrCat(
      "rank ", rank, " of ", world_size, ": ", CollectiveBackendAvailable(CollectiveBackend::kGloo).message()));
#endif
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> ConnectProcessGroup(
    const ProcessGroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in a world of ", options.world_size));
  }
  if (options.backend == CollectiveBackend::kSingleRank) {
    if (options.world_size != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("a single-rank group for a world of ", options.world_size, " ranks"));
    }
    return CreateSingleRankProcessGroup();
  }
  if (options.master_port <= 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT ", options.master_port, " is not a port"));
  }
  c10::intrusive_ptr<c10d::Store> store;
  const std::string where = absl::StrCat(options.master_addr, ":", options.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(options.master_port);
    store_options.isServer = options.rank == 0 && !options.agent_store;
    store_options.numWorkers = options.world_size;
    // Our own barrier below waits for the peers with a clear error; the store's would only time out.
    store_options.waitWorkers = false;
    // LibTorch 1.13's client gives up without retrying when its timeout is under two seconds (it
    // retries once a second and truncates to whole seconds), so the store never gets less.
    store_options.timeout = ToChrono(std::max(options.rendezvous_timeout, absl::Seconds(2)));
    if (!store_options.isServer) {
      WaitUntilAccepting(options.master_addr, options.master_port, absl::Now() + options.rendezvous_timeout);
    }
    store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, absl::StrCat("rendezvous at ", where));
  }

  // Every rank joins before the Gloo group is built, so the group's own connection phase (bounded
  // by the shorter collective timeout) starts with all peers present.
  try {
    const absl::Time deadline = absl::Now() + options.rendezvous_timeout;
    int64_t joined = store->add("fitrun/joined", 1);
    while (joined < options.world_size) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rendezvous at ", where, ": only ", joined, " of ", options.world_size,
            " ranks joined within ", absl::FormatDuration(options.rendezvous_timeout)));
      }
      absl::SleepFor(absl::Milliseconds(20));
      joined = store->add("fitrun/joined", 0);
    }
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, absl::StrCat("rendezvous at ", where));
  }
  if (options.backend == CollectiveBackend::kNccl) {
    return CreateNcclProcessGroup(store, options.rank, options.world_size, options.collective_timeout);
  }
  return CreateGlooProcessGroup(store, options.rank, options.world_size, options.collective_timeout,
                                options.master_addr, options.shared_memory_all_reduce);
}

absl::Status BroadcastModuleState(c10d::ProcessGroup& group, const torch::nn::Module& module) {
  std::vector<at::Tensor> state = module.parameters();
  for (const at::Tensor& buffer : module.buffers()) state.push_back(buffer);
  if (state.empty()) return absl::OkStatus();
  try {
    at::NoGradGuard no_grad;
    // One flat buffer per dtype would be needed for mixed models; the builtins are all float32.
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : state) {
      if (t.scalar_type() != at::kFloat) {
        return absl::UnimplementedError(absl::StrCat("broadcasting a ", c10::toString(t.scalar_type()),
                                                     " tensor (only float32 models are supported)"));
      }
      flat_parts.push_back(t.detach().reshape({-1}));
    }
    std::vector<at::Tensor> flat = {at::cat(flat_parts)};
    group.broadcast(flat)->wait();
    int64_t offset = 0;
    for (const at::Tensor& t : state) {
      t.detach().copy_(flat[0].narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, "broadcasting rank 0's parameters");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BroadcastInt64(c10d::ProcessGroup& group, int64_t value, const at::Device& device) {
  try {
    std::vector<at::Tensor> tensors = {at::full({1}, value, at::TensorOptions().dtype(at::kLong).device(device))};
    group.broadcast(tensors)->wait();
    return tensors[0].item<int64_t>();
  } catch (const std::exception& e) {
    return StatusFromC10dException(e, "broadcasting rank 0's value");
  }
}

}  // namespace fitrun::worker
