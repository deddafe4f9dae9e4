#include "worker/probe/probe_mode.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "fitrun/v1/launch_contract.h"
#include "worker/memory/capped_allocator.h"
#include "worker/options.h"
#include "worker/probe/memory_probe.h"

namespace fitrun::worker {
namespace {

void PrintLine(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

// fitrun-worker --probe: prints the probe's header line (see memory_probe.h), then measures each
// batch of --probe_batches, or each batch size read from stdin (one per line, until end of input),
// printing one line per measurement as soon as it is done, so fitrund can decide what to measure
// next from what it has seen. Exits 0, or 2 when the spec cannot be probed or a measurement fails.
int RunProbeMode(const std::vector<int64_t>& batches) {
  const char* path_value = std::getenv(fitrun::v1::launch::kAssignment);
  const std::optional<std::string> path =
      path_value == nullptr ? std::nullopt : std::optional<std::string>(path_value);
  absl::Status status;
  if (!path.has_value() || path->empty()) {
    status = absl::InvalidArgumentError(absl::StrCat(fitrun::v1::launch::kAssignment, ": not set"));
  } else if (absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = LoadAssignment(*path); !assignment.ok()) {
    status = assignment.status();
  } else {
    // Never freed, as in the built-in training program: LibTorch keeps the installed allocator until exit. The
    // assignment's memory cap, if any, is the probe's budget.
    auto* counter = new CappedCpuAllocator(
        assignment->memory_cap_bytes_size() > 0 ? std::max<int64_t>(0, assignment->memory_cap_bytes(0)) : 0);
    absl::StatusOr<std::unique_ptr<MemoryProbe>> probe = MemoryProbe::Create(*assignment, counter);
    if (probe.ok()) {
      PrintLine(ProbeHeaderJson(**probe));
      // A batch past the budget is an answer (the caller measures smaller ones next); any other
      // failure ends the probe.
      auto measure = [&](int64_t batch) {
        absl::StatusOr<ProbePeak> peak = (*probe)->Measure(batch);
        PrintLine(peak.ok() ? ProbePeakJson(*peak) : ProbeErrorJson(batch, peak.status()));
        return absl::IsResourceExhausted(peak.status()) ? absl::OkStatus() : peak.status();
      };
      if (!batches.empty()) {
        for (int64_t batch : batches) {
          if (status = measure(batch); !status.ok()) break;
        }
      } else {
        std::string line;
        while (status.ok() && std::getline(std::cin, line)) {
          int64_t batch = 0;
          if (absl::StripAsciiWhitespace(line).empty()) continue;
          if (!absl::SimpleAtoi(line, &batch)) {
            status = absl::InvalidArgumentError(absl::StrCat("stdin: expected a batch size, got \"", line, "\""));
            break;
          }
          status = measure(batch);
        }
      }
      if (status.ok()) return fitrun::v1::launch::kExitSuccess;
    } else {
      status = probe.status();
    }
  }
  std::fprintf(stderr, "fitrun-worker --probe: %s\n", std::string(status.message()).c_str());
  return fitrun::v1::launch::kExitBadConfiguration;
}

}  // namespace fitrun::worker
