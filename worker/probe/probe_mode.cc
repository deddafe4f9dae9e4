#include "worker/probe/probe_mode.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/launch_contract.h"
#include "worker/memory/caching_cpu_allocator.h"
#include "worker/memory/capped_allocator.h"
#include "worker/options.h"
#include "worker/probe/memory_probe.h"
#include "worker/probe/probe_protocol.h"
#include "worker/probe/script_probe.h"

namespace fitrun::worker {
namespace {

absl::Status Probe(const std::vector<int64_t>& batches) {
  absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = LoadProbeAssignment();
  if (!assignment.ok()) return assignment.status();
  if (assignment->spec().has_script()) return ProbeScript(*assignment, batches);
  // Never freed, as in the built-in training program: LibTorch keeps the installed allocator until
  // exit. A static holds it, so it stays reachable (no leak under ASan) when Create fails before
  // installing it. The assignment's memory cap, if any, is the probe's budget. Its blocks come from
  // the cache training takes them from, so that the step times it measures are training's.
  static CappedCpuAllocator* counter = nullptr;
  counter = new CappedCpuAllocator(ProbeResourcesOf(*assignment).memory_cap_bytes, RankHostBlockCache());
  absl::StatusOr<std::unique_ptr<MemoryProbe>> probe = MemoryProbe::Create(*assignment, counter);
  if (!probe.ok()) return probe.status();
  return MeasureAll(ProbeHeaderJson((*probe)->model_state_bytes(), (*probe)->train_samples()),
                    [&](int64_t batch) { return (*probe)->Measure(batch); }, batches);
}

}  // namespace

// fitrun-worker --probe: prints the probe's header line (see memory_probe.h), then measures each
// batch of --probe_batches, or each batch size read from stdin (one per line, until end of input),
// printing one line per measurement as soon as it is done, so fitrund can decide what to measure
// next from what it has seen. Exits 0, or 2 when the spec cannot be probed or a measurement fails.
int RunProbeMode(const std::vector<int64_t>& batches) { return ProbeExitCode("fitrun-worker", Probe(batches)); }

}  // namespace fitrun::worker
