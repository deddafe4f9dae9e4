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
#include "worker/memory/capped_allocator.h"
#include "worker/options.h"
#include "worker/probe/memory_probe.h"
#include "worker/probe/script_probe.h"

namespace fitrun::worker {
namespace {

void PrintLine(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Runs `measure` on each batch of `batches`, or of stdin when empty, printing its header first. A
// batch past the budget is an answer (the caller measures smaller ones next); any other failure ends
// the probe.
absl::Status MeasureAll(const std::string& header, const std::function<absl::StatusOr<ProbePeak>(int64_t)>& measure_one,
                        const std::vector<int64_t>& batches) {
  PrintLine(header);
  auto measure = [&](int64_t batch) {
    absl::StatusOr<ProbePeak> peak = measure_one(batch);
    PrintLine(peak.ok() ? ProbePeakJson(*peak) : ProbeErrorJson(batch, peak.status()));
    return absl::IsResourceExhausted(peak.status()) ? absl::OkStatus() : peak.status();
  };
  absl::Status status;
  if (!batches.empty()) {
    for (int64_t batch : batches) {
      if (status = measure(batch); !status.ok()) break;
    }
    return status;
  }
  std::string line;
  while (status.ok() && std::getline(std::cin, line)) {
    int64_t batch = 0;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (!absl::SimpleAtoi(line, &batch)) {
      return absl::InvalidArgumentError(absl::StrCat("stdin: expected a batch size, got \"", line, "\""));
    }
    status = measure(batch);
  }
  return status;
}

absl::Status Probe(const std::vector<int64_t>& batches) {
  const char* path = std::getenv(fitrun::contract::launch::kAssignment);
  if (path == nullptr || *path == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(fitrun::contract::launch::kAssignment, ": not set"));
  }
  absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = LoadAssignment(path);
  if (!assignment.ok()) return assignment.status();
  if (assignment->spec().has_script()) {
    // A script's size and dataset are its own: the header says only that nothing is known.
    absl::StatusOr<std::unique_ptr<ScriptProbe>> probe = ScriptProbe::Create(*assignment);
    if (!probe.ok()) return probe.status();
    return MeasureAll("{\"model_state_bytes\": 0, \"train_samples\": 0}",
                      [&](int64_t batch) { return (*probe)->Measure(batch); }, batches);
  }
  // Never freed, as in the built-in training program: LibTorch keeps the installed allocator until
  // exit. A static holds it, so it stays reachable (no leak under ASan) when Create fails before
  // installing it. The assignment's memory cap, if any, is the probe's budget.
  static CappedCpuAllocator* counter = nullptr;
  counter = new CappedCpuAllocator(
      assignment->memory_cap_bytes_size() > 0 ? std::max<int64_t>(0, assignment->memory_cap_bytes(0)) : 0);
  absl::StatusOr<std::unique_ptr<MemoryProbe>> probe = MemoryProbe::Create(*assignment, counter);
  if (!probe.ok()) return probe.status();
  return MeasureAll(ProbeHeaderJson(**probe), [&](int64_t batch) { return (*probe)->Measure(batch); }, batches);
}

}  // namespace

// fitrun-worker --probe: prints the probe's header line (see memory_probe.h), then measures each
// batch of --probe_batches, or each batch size read from stdin (one per line, until end of input),
// printing one line per measurement as soon as it is done, so fitrund can decide what to measure
// next from what it has seen. Exits 0, or 2 when the spec cannot be probed or a measurement fails.
int RunProbeMode(const std::vector<int64_t>& batches) {
  const absl::Status status = Probe(batches);
  if (status.ok()) return fitrun::contract::launch::kExitSuccess;
  std::fprintf(stderr, "fitrun-worker --probe: %s\n", std::string(status.message()).c_str());
  return fitrun::contract::launch::kExitBadConfiguration;
}

}  // namespace fitrun::worker
