#include "worker/probe/probe_protocol.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"
#include "worker/options.h"

namespace fitrun::worker {
namespace {

void PrintLine(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

std::string ProbeHeaderJson(int64_t model_state_bytes, int64_t train_samples) {
  return absl::StrCat("{\"model_state_bytes\": ", model_state_bytes, ", \"train_samples\": ", train_samples, "}");
}

std::string ProbePeakJson(const ProbePeak& p) {
  return absl::StrCat("{\"batch\": ", p.batch, ", \"peak_bytes\": ", p.peak_bytes,
                      ", \"backward_peak_bytes\": ", p.backward_peak_bytes,
                      ", \"other_peak_bytes\": ", p.other_peak_bytes,
                      absl::StrFormat(", \"step_seconds\": %.6f}", p.step_seconds));
}

std::string ProbeErrorJson(int64_t batch, const absl::Status& status) {
  std::string message;
  for (char c : status.message()) {
    if (c == '"' || c == '\\') {
      message += '\\';
      message += c;
    } else if (c == '\n') {
      message += "\\n";
    } else if (static_cast<unsigned char>(c) >= 0x20) {
      message += c;
    }
  }
  return absl::StrCat("{\"batch\": ", batch, ", \"error\": \"", message, "\"",
                      absl::IsResourceExhausted(status) ? ", \"out_of_memory\": true" : "", "}");
}

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

absl::StatusOr<fitrun::v1::WorkerAssignment> LoadProbeAssignment() {
  const char* path = std::getenv(fitrun::contract::launch::kAssignment);
  if (path == nullptr || *path == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(fitrun::contract::launch::kAssignment, ": not set"));
  }
  return LoadAssignment(path);
}

int ProbeExitCode(const std::string& program, const absl::Status& status) {
  if (status.ok()) return fitrun::contract::launch::kExitSuccess;
  contract::LogError("%s --probe: %s", program, status.message());
  return fitrun::contract::launch::kExitBadConfiguration;
}

}  // namespace fitrun::worker
