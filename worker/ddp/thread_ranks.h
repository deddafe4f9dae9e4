// Test support: N ranks as threads of one process over a real Gloo group on a FileStore, the way
// PyTorch's c10d tests exercise collectives without a GPU or a second process.
#ifndef FITRUN_WORKER_DDP_THREAD_RANKS_H_
#define FITRUN_WORKER_DDP_THREAD_RANKS_H_

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace fitrun::worker {

// A path under TEST_TMPDIR with nothing at it yet.
std::string FreshTestPath(const std::string& name);

// Runs body(rank, group) on `world` threads whose groups meet through the FileStore `store_name`,
// and returns when every thread has. A group that cannot be built fails the test.
void RunRanksAsThreads(int world, const std::string& store_name,
                       const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& body,
                       absl::Duration timeout = absl::Seconds(10));

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_THREAD_RANKS_H_
