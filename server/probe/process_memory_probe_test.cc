#include "server/probe/process_memory_probe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

std::string TestDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// A stand-in for fitrun-worker: a shell script with the given body.
std::string FakeWorker(const std::string& name, const std::string& body) {
  const std::string path = (std::filesystem::path(TestDir()) / name).string();
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

fitrun::v1::JobSpec Spec() {
  fitrun::v1::JobSpec spec;
  spec.set_name("probe-me");
  spec.mutable_model()->set_builtin("mlp");
  return spec;
}

ProcessMemoryProbe::Options OptionsFor(const std::string& binary) {
  ProcessMemoryProbe::Options options;
  options.worker_binary = binary;
  options.work_dir = (std::filesystem::path(TestDir()) / "probes").string();
  options.timeout = absl::Seconds(10);
  return options;
}

TEST(ParseProbeJsonTest, ReadsTheWorkersLine) {
  absl::StatusOr<ProbeResult> r = ParseProbeJson(
      R"({"model_state_bytes": 2678824, "peaks": [{"batch": 2, "peak_bytes": 12333376}, )"
      R"({"batch": 8, "peak_bytes": 12364528}], "fixed_bytes": 12322992, "per_sample_bytes": 5192})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model_state_bytes, 2678824);
  EXPECT_EQ(r->fixed_bytes, 12322992);
  EXPECT_EQ(r->per_sample_bytes, 5192);
  EXPECT_EQ(r->small_batch, 2);
  EXPECT_EQ(r->large_batch, 8);
  EXPECT_EQ(r->small_peak_bytes, 12333376);
  EXPECT_EQ(r->large_peak_bytes, 12364528);
  EXPECT_FALSE(ParseProbeJson("Segmentation fault").ok());
}

TEST(ProcessMemoryProbeTest, RunsTheWorkerAtSmallThenLargeBatchesAndFitsBothLines) {
  // Checks its argv and that the assignment file carries the spec, then answers like a model whose
  // peak is max(1000 + 100 b, 10 + 150 b): a plateau at small batches, steeper at large ones.
  const std::string worker = FakeWorker("probe_ok.sh", R"(
[ "$1" = "--probe" ] || { echo "bad argv: $*" >&2; exit 2; }
grep -q 'name: "probe-me"' "$FITRUN_ASSIGNMENT" || { echo "no spec in $FITRUN_ASSIGNMENT" >&2; exit 2; }
grep -q 'cpu_threads: 1' "$FITRUN_ASSIGNMENT" || { echo "no threads" >&2; exit 2; }
echo "loading..." >&2
case "$2" in
  --probe_batches=4,16) echo '{"model_state_bytes": 100, "peaks": [{"batch": 4, "peak_bytes": 1400}, {"batch": 16, "peak_bytes": 2600}], "fixed_bytes": 1000, "per_sample_bytes": 100}' ;;
  --probe_batches=32,64) echo '{"model_state_bytes": 100, "peaks": [{"batch": 32, "peak_bytes": 4810}, {"batch": 64, "peak_bytes": 9610}], "fixed_bytes": 10, "per_sample_bytes": 150}' ;;
  *) echo "bad batches: $2" >&2; exit 2 ;;
esac)");
  auto probe = *ProcessMemoryProbe::Create(OptionsFor(worker));
  absl::StatusOr<ProbeResult> r = probe->Probe(Spec());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->small_fixed_bytes, 1000);
  EXPECT_EQ(r->small_per_sample_bytes, 100);
  EXPECT_EQ(r->fixed_bytes, 10);
  EXPECT_EQ(r->per_sample_bytes, 150);
  EXPECT_EQ(r->small_batch, 4);
  EXPECT_EQ(r->large_batch, 64);
  EXPECT_EQ(r->large_peak_bytes, 9610);
  // The assignment file is gone afterwards.
  EXPECT_TRUE(std::filesystem::is_empty(OptionsFor(worker).work_dir));
}

TEST(ProcessMemoryProbeTest, AFailingWorkerIsReportedWithItsStderr) {
  const std::string worker =
      FakeWorker("probe_bad.sh", "echo 'fitrun-worker --probe: spec.model.torchscript: not a module' >&2; exit 2");
  auto probe = *ProcessMemoryProbe::Create(OptionsFor(worker));
  absl::StatusOr<ProbeResult> r = probe->Probe(Spec());
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("exited with 2"));
  EXPECT_THAT(r.status().message(), HasSubstr("spec.model.torchscript: not a module"));
}

TEST(ProcessMemoryProbeTest, AHungWorkerIsKilledAtTheTimeout) {
  const std::string worker = FakeWorker("probe_hang.sh", "exec sleep 60");
  ProcessMemoryProbe::Options options = OptionsFor(worker);
  options.timeout = absl::Milliseconds(300);
  auto probe = *ProcessMemoryProbe::Create(options);
  const absl::Time start = absl::Now();
  absl::StatusOr<ProbeResult> r = probe->Probe(Spec());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ProcessMemoryProbeTest, AMissingBinaryIsAnError) {
  auto probe = *ProcessMemoryProbe::Create(OptionsFor("/nonexistent/fitrun-worker"));
  EXPECT_EQ(probe->Probe(Spec()).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fitrun::server
