// fitrun-worker --probe: the process around MemoryProbe (memory_probe.h) that fitrund's calibration
// talks to over stdin and stdout.
#ifndef FITRUN_WORKER_PROBE_PROBE_MODE_H_
#define FITRUN_WORKER_PROBE_PROBE_MODE_H_

#include <cstdint>
#include <vector>

namespace fitrun::worker {

// Measures `batches` (or, when empty, one batch size per line of stdin) for the assignment named by
// FITRUN_ASSIGNMENT, one JSON line each on stdout; returns the exit code.
int RunProbeMode(const std::vector<int64_t>& batches);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROBE_PROBE_MODE_H_
