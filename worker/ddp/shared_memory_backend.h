#ifndef FITRUN_WORKER_DDP_SHARED_MEMORY_BACKEND_H_
#define FITRUN_WORKER_DDP_SHARED_MEMORY_BACKEND_H_

#include <c10/util/intrusive_ptr.h>

#include "absl/time/time.h"
#include "worker/torch_compat.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace fitrun::worker {

// `fallback` (a Gloo backend) with its sum all-reduces of dense CPU float32 and float64 tensors carried
// through shared memory instead (worker/ddp/shared_memory_all_reduce.h), when every rank of the group
// can map one segment: ranks on one machine. Every other collective (broadcast, all-gather, barrier,
// other dtypes and ops) still goes to `fallback`, in the order issued.
//
// Joins through `store` (the group's rendezvous store; SharedMemoryAllReduce::Join): ranks on several
// machines, or in containers that do not share /dev/shm, all keep `fallback` itself, as a group of
// one rank does. Every rank of the group calls it, once.
c10::intrusive_ptr<torch_compat::C10dBackend> WithSharedMemoryAllReduce(
    c10::intrusive_ptr<torch_compat::C10dBackend> fallback, const c10::intrusive_ptr<c10d::Store>& store, int rank,
    int world_size, absl::Duration timeout);

// Whether `group`'s sums of CPU tensors go through shared memory (WithSharedMemoryAllReduce took).
bool SumsInSharedMemory(c10d::ProcessGroup& group);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_SHARED_MEMORY_BACKEND_H_
