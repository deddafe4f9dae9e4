#include "worker/torch_compat.h"

#include <ATen/core/Tensor.h>
#include <c10/util/C++17.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <utility>

namespace fitrun::worker::torch_compat {

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupOver(c10::intrusive_ptr<C10dBackend> backend,
                                                        const c10::intrusive_ptr<c10d::Store>& store,
                                                        c10::DeviceType device_type) {
#if TORCH_VERSION_MAJOR >= 2
  // As torch.distributed builds a group: the collectives of `device_type`'s tensors go to `backend`,
  // and the group takes its name ("gloo", "nccl") from the default backend.
  using BackendType = c10d::ProcessGroup::BackendType;
  const BackendType type = device_type == c10::kCUDA ? BackendType::NCCL : BackendType::GLOO;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(), backend->getSize());
  group->setDefaultBackend(type);
  group->setBackend(device_type, type, std::move(backend));
  return group;
#else
  (void)store;
  (void)device_type;
  return backend;
#endif
}

C10dBackend* BackendOf(c10d::ProcessGroup& group, c10::DeviceType device_type) {
#if TORCH_VERSION_MAJOR >= 2
  return group.getBackend(device_type).get();
#else
  (void)device_type;
  return &group;
#endif
}

OptimizerStateKeyType OptimizerStateKey(const at::Tensor& parameter) {
#if TORCH_VERSION_MAJOR >= 2
  return parameter.unsafeGetTensorImpl();
#else
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#endif
}

}  // namespace fitrun::worker::torch_compat
