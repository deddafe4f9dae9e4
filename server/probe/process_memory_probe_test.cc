#include "server/probe/process_memory_probe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/sandbox/throwaway_cgroups.h"
#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

fitrun::v1::JobSpec Spec() {
  fitrun::v1::JobSpec spec;
  spec.set_name("probe-me");
  spec.mutable_model()->set_builtin("mlp");
  return spec;
}

// Each test's fake workers and probe work directory in a directory of its own.
class ProcessMemoryProbeTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  // A stand-in for fitrun-worker: a shell script with the given body.
  std::string FakeWorker(const std::string& name, const std::string& body) {
    const std::string path = dir_.Join(name);
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    chmod(path.c_str(), 0755);
    return path;
  }

  ProcessMemoryProbe::Options OptionsFor(const std::string& binary) {
    ProcessMemoryProbe::Options options;
    options.worker_binary = binary;
    options.work_dir = dir_.Join("probes");
    options.start_timeout = absl::Seconds(10);
    options.measure_timeout = absl::Seconds(10);
    return options;
  }

  // The fake answers one batch when the assignment has, or has not, the device it greps for.
  std::string DeviceCheckingWorker(const std::string& name, bool expect_device) {
    const std::string check =
        expect_device ? R"(grep -q 'device_ids: "cuda:1#0"' "$FITRUN_ASSIGNMENT" || { echo "no device" >&2; exit 2; })"
                      : R"(! grep -q 'device_ids' "$FITRUN_ASSIGNMENT" || { echo "a device" >&2; exit 2; })";
    return FakeWorker(name, check + R"sh(
echo '{"model_state_bytes": 0, "train_samples": 0}'
while read b; do echo "{\"batch\": $b, \"peak_bytes\": 7, \"backward_peak_bytes\": 7, \"other_peak_bytes\": 0}"; done)sh");
  }

  TempDir dir_;
};

TEST(ParseProbeLineTest, ReadsTheHeaderMeasurementsAndErrors) {
  absl::StatusOr<ProbeLine> header = ParseProbeLine(R"({"model_state_bytes": 2678824, "train_samples": 60000})");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->model_state_bytes, 2678824);
  EXPECT_EQ(header->train_samples, 60000);
  absl::StatusOr<ProbeLine> peak = ParseProbeLine(
      R"({"batch": 8, "peak_bytes": 12364528, "backward_peak_bytes": 12364528, "other_peak_bytes": 1})");
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_EQ(peak->batch, 8);
  EXPECT_EQ(peak->peak_bytes, 12364528);
  EXPECT_EQ(peak->step_seconds, 0);  // a probe that does not time its steps
  absl::StatusOr<ProbeLine> timed = ParseProbeLine(
      R"({"batch": 8, "peak_bytes": 12364528, "backward_peak_bytes": 12364528, "other_peak_bytes": 1, "step_seconds": 0.012500})");
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_DOUBLE_EQ(timed->step_seconds, 0.0125);
  absl::StatusOr<ProbeLine> oom =
      ParseProbeLine(R"({"batch": 4096, "error": "step 2: out of \"device\" memory", "out_of_memory": true})");
  ASSERT_TRUE(oom.ok()) << oom.status();
  EXPECT_TRUE(oom->out_of_memory);
  EXPECT_EQ(oom->error, "step 2: out of \"device\" memory");
  // A script's traceback keeps its lines and tabs.
  absl::StatusOr<ProbeLine> traceback = ParseProbeLine(
      R"({"batch": 8, "error": "its stderr ended with:\nTraceback (most recent call last):\n\tFile \"train.py\", \u0041 \\", "out_of_memory": false})");
  ASSERT_TRUE(traceback.ok()) << traceback.status();
  EXPECT_EQ(traceback->error, "its stderr ended with:\nTraceback (most recent call last):\n\tFile \"train.py\", A \\");
  EXPECT_FALSE(ParseProbeLine("Segmentation fault").ok());
  EXPECT_FALSE(ParseProbeLine(R"({"batch": 8})").ok());
}

// The nice value a probe started with nice 10 has: 10 more than this test's own (a test run under
// `nice` starts niced), at most 19.
std::string ExpectedProbeNice() {
  errno = 0;
  const int own = getpriority(PRIO_PROCESS, 0);
  return absl::StrCat(std::min(19, own + 10));
}

TEST_F(ProcessMemoryProbeTest, OneProcessMeasuresEveryBatchItIsSent) {
  // Checks its argv, that it runs niced, and that the assignment carries the spec, the threads, the
  // budget as the memory cap and the ranks' dataset cache; then answers each batch b read from stdin like a model whose peak is 1000 + 100 b,
  // refusing what passes the budget, and logs one line per batch to a file so the test can see
  // that a single process served them all.
  const std::string log = dir_.Join("probe_ok.log");
  const std::string worker = FakeWorker("probe_ok.sh", R"sh(
[ "$1" = "--probe" ] && [ -z "$2" ] || { echo "bad argv: $*" >&2; exit 2; }
grep -q 'name: "probe-me"' "$FITRUN_ASSIGNMENT" || { echo "no spec in $FITRUN_ASSIGNMENT" >&2; exit 2; }
grep -q 'cpu_threads: 1' "$FITRUN_ASSIGNMENT" || { echo "no threads" >&2; exit 2; }
grep -q 'memory_cap_bytes: 50000' "$FITRUN_ASSIGNMENT" || { echo "no budget" >&2; exit 2; }
grep -q 'dataset_cache_dir: "/srv/fitrun/datasets"' "$FITRUN_ASSIGNMENT" || { echo "no dataset cache" >&2; exit 2; }
[ "$(cut -d' ' -f19 /proc/$$/stat)" = )sh" + ExpectedProbeNice() + R"sh( ] || { echo "not niced" >&2; exit 2; }
echo "loading..." >&2
echo '{"model_state_bytes": 100, "train_samples": 1000}'
while read b; do
  echo "$$ $b" >> )sh" + log + R"sh(
  peak=$((1000 + 100 * b))
  if [ $peak -gt 50000 ]; then
    echo "{\"batch\": $b, \"error\": \"step 1: out of device memory\", \"out_of_memory\": true}"
  else
    echo "{\"batch\": $b, \"peak_bytes\": $peak, \"backward_peak_bytes\": $peak, \"other_peak_bytes\": 0}"
  fi
done)sh");
  ProcessMemoryProbe::Options options = OptionsFor(worker);
  options.dataset_cache_dir = "/srv/fitrun/datasets";
  auto probe = *ProcessMemoryProbe::Create(options);
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 50000, "");
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->model_state_bytes(), 100);
  EXPECT_EQ((*session)->train_samples(), 1000);
  EXPECT_EQ(*(*session)->MeasurePeak(4), 1400);
  EXPECT_EQ(*(*session)->MeasurePeak(64), 7400);
  EXPECT_EQ((*session)->MeasurePeak(900).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*(*session)->MeasurePeak(16), 2600) << "the probe goes on after a batch past the budget";
  session->reset();
  // One process served all four, and its assignment file is gone.
  std::ifstream in(log);
  std::set<std::string> pids;
  int lines = 0;
  for (std::string pid, batch; in >> pid >> batch; ++lines) pids.insert(pid);
  EXPECT_EQ(lines, 4);
  EXPECT_EQ(pids.size(), 1u);
  EXPECT_TRUE(std::filesystem::is_empty(OptionsFor(worker).work_dir));
}

TEST_F(ProcessMemoryProbeTest, AWorkerThatRefusesTheSpecIsReportedWithItsStderr) {
  const std::string worker =
      FakeWorker("probe_bad.sh", "echo 'fitrun-worker --probe: spec.model.torchscript: not a module' >&2; exit 2");
  auto probe = *ProcessMemoryProbe::Create(OptionsFor(worker));
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
  ASSERT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(session.status().message(), HasSubstr("exited with 2"));
  EXPECT_THAT(session.status().message(), HasSubstr("spec.model.torchscript: not a module"));
}

TEST_F(ProcessMemoryProbeTest, AWorkerThatDiesMidwayIsAnErrorNotACrash) {
  const std::string worker = FakeWorker("probe_dies.sh", R"(
echo '{"model_state_bytes": 100, "train_samples": 1000}'
read b
echo "Segmentation fault" >&2
kill -SEGV $$)");
  auto probe = *ProcessMemoryProbe::Create(OptionsFor(worker));
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<int64_t> peak = (*session)->MeasurePeak(4);
  ASSERT_FALSE(peak.ok());
  EXPECT_THAT(peak.status().message(), HasSubstr("killed by signal 11"));
  EXPECT_THAT(peak.status().message(), HasSubstr("Segmentation fault"));
  // Sending it another batch fails cleanly too (no SIGPIPE for the test process).
  EXPECT_FALSE((*session)->MeasurePeak(8).ok());
}

TEST_F(ProcessMemoryProbeTest, AHungWorkerIsKilledAtTheTimeout) {
  const std::string worker = FakeWorker("probe_hang.sh", R"(
echo '{"model_state_bytes": 100, "train_samples": 1000}'
exec sleep 60)");
  ProcessMemoryProbe::Options options = OptionsFor(worker);
  options.measure_timeout = absl::Milliseconds(300);
  auto probe = *ProcessMemoryProbe::Create(options);
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  const absl::Time start = absl::Now();
  EXPECT_EQ((*session)->MeasurePeak(4).status().code(), absl::StatusCode::kDeadlineExceeded);
  session->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// The job's owner controls what the probe writes: a line that never ends stops the probe at 64 KiB
// instead of growing in fitrund's memory until the measurement's timeout.
TEST_F(ProcessMemoryProbeTest, ALineWithoutEndStopsTheProbe) {
  const std::string worker = FakeWorker("probe_endless_line.sh", R"(
echo '{"model_state_bytes": 100, "train_samples": 1000}'
read b
head -c 16777216 /dev/zero
exec sleep 20)");
  ProcessMemoryProbe::Options options = OptionsFor(worker);
  options.measure_timeout = absl::Seconds(5);
  auto probe = *ProcessMemoryProbe::Create(options);
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> peak = (*session)->MeasurePeak(4);
  EXPECT_LT(absl::Now() - start, options.measure_timeout) << "it waited for the newline";
  EXPECT_EQ(peak.status().code(), absl::StatusCode::kInternal) << peak.status();
  EXPECT_THAT(peak.status().message(),
              HasSubstr("while measuring micro-batch 4, it wrote more than 65536 bytes on stdout without a newline"));
  // Stopped: nothing more it wrote is taken for an answer.
  EXPECT_FALSE((*session)->MeasurePeak(8).ok());
}

// A probe's child (its owner's) that keeps the probe's stderr open after the probe ended costs the
// calibrator a short grace, not the child's lifetime.
TEST_F(ProcessMemoryProbeTest, AChildHoldingStderrDoesNotHoldTheMeasurement) {
  const std::string child_pid = dir_.Join("probe_stderr_child.pid");
  const std::string worker = FakeWorker("probe_stderr_held.sh", absl::StrCat(R"(
echo '{"model_state_bytes": 100, "train_samples": 1000}'
read b
sleep 20 </dev/null >/dev/null &
echo $! > )", child_pid, R"(
echo "step 1: crashed" >&2
exit 3)"));
  auto probe = *ProcessMemoryProbe::Create(OptionsFor(worker));
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> peak = (*session)->MeasurePeak(4);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "it waited for the child";
  EXPECT_EQ(peak.status().code(), absl::StatusCode::kInvalidArgument) << peak.status();
  EXPECT_THAT(peak.status().message(), HasSubstr("exited with 3"));
  EXPECT_THAT(peak.status().message(), HasSubstr("step 1: crashed"));
  std::ifstream in(child_pid);
  if (int pid = 0; in >> pid && pid > 0) kill(pid, SIGKILL);
}

// Its owner can stop the probe and fill the pipe fitrund writes batch sizes to (reopened through
// /proc): sending one then fails at the measurement's timeout instead of blocking the calibrator.
TEST_F(ProcessMemoryProbeTest, AProbeWhoseInputIsFullIsStoppedAtTheTimeout) {
  const std::string worker = FakeWorker("probe_full_input.sh", R"(
exec 3>/proc/$$/fd/0
timeout 1 cat /dev/zero </dev/null >&3
exec 3>&-
echo '{"model_state_bytes": 100, "train_samples": 1000}'
exec sleep 20)");
  ProcessMemoryProbe::Options options = OptionsFor(worker);
  options.measure_timeout = absl::Seconds(1);
  auto probe = *ProcessMemoryProbe::Create(options);
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> peak = (*session)->MeasurePeak(4);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the write blocked";
  EXPECT_EQ(peak.status().code(), absl::StatusCode::kDeadlineExceeded) << peak.status();
  EXPECT_THAT(peak.status().message(), HasSubstr("sending it micro-batch 4 took longer than 1s"));
}

// What a probe wrote on stderr reaches error messages (the job's events, an admin's terminal,
// fitrund's log) with its control characters escaped, its tail starting at a whole UTF-8 character.
TEST_F(ProcessMemoryProbeTest, ItsOutputInAMessageHasNoControlCharactersOrHalfCharacters) {
  const std::string worker = FakeWorker("probe_escapes.sh", R"(
echo '{"model_state_bytes": 100, "train_samples": 1000}'
read b
printf 'clear \033[2J\r' >&2
i=0; while [ $i -lt 1000 ]; do printf '\303\251' >&2; i=$((i+1)); done
printf 'x\n' >&2
exit 3)");
  auto probe = *ProcessMemoryProbe::Create(OptionsFor(worker));
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<int64_t> peak = (*session)->MeasurePeak(4);
  ASSERT_FALSE(peak.ok());
  const std::string message(peak.status().message());
  const size_t tail = message.find("...");
  ASSERT_NE(tail, std::string::npos) << message;
  EXPECT_NE(static_cast<unsigned char>(message[tail + 3]) & 0xC0, 0x80) << "starts inside a character";
  EXPECT_EQ(message.substr(message.size() - 3), "\xc3\xa9x");
  for (const char c : message) EXPECT_FALSE(c == '\033' || c == '\r') << message;

  const std::string short_worker = FakeWorker("probe_escapes_short.sh", R"(
echo '{"model_state_bytes": 100, "train_samples": 1000}'
read b
printf 'clear \033[2J\rline two\n' >&2
exit 3)");
  auto short_probe = *ProcessMemoryProbe::Create(OptionsFor(short_worker));
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> short_session = short_probe->Start(Spec(), 1 << 30, "");
  ASSERT_TRUE(short_session.ok()) << short_session.status();
  EXPECT_THAT((*short_session)->MeasurePeak(4).status().message(), HasSubstr("clear \\x1b[2J\\x0dline two"));
}

TEST_F(ProcessMemoryProbeTest, AMissingBinaryIsAnError) {
  auto probe = *ProcessMemoryProbe::Create(OptionsFor("/nonexistent/fitrun-worker"));
  EXPECT_EQ(probe->Start(Spec(), 1 << 30, "").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ProcessMemoryProbeTest, AScriptIsProbedOnTheConfiguredGpuAndABuiltinTimedThere) {
  fitrun::v1::JobSpec script = Spec();
  script.clear_model();
  script.mutable_script()->add_command("/usr/bin/python3");
  {
    ProcessMemoryProbe::Options options = OptionsFor(DeviceCheckingWorker("probe_gpu.sh", /*expect_device=*/true));
    options.script_binary = options.worker_binary;
    options.probe_device_id = "cuda:1#0";
    options.nice = 0;
    auto probe = *ProcessMemoryProbe::Create(options);
    absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(script, 1 << 30, "");
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ(*(*session)->MeasurePeak(2), 7);
  }
  {
    // A built-in workload's probe is told the GPU too: it times its steps there (its memory it
    // measures on the host).
    ProcessMemoryProbe::Options options = OptionsFor(DeviceCheckingWorker("probe_timed.sh", /*expect_device=*/true));
    options.probe_device_id = "cuda:1#0";
    options.nice = 0;
    auto probe = *ProcessMemoryProbe::Create(options);
    absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ(*(*session)->MeasurePeak(2), 7);
  }
  {
    // Without GPUs, a built-in workload's probe names no device and runs on the host, as ever.
    ProcessMemoryProbe::Options options = OptionsFor(DeviceCheckingWorker("probe_host.sh", /*expect_device=*/false));
    options.nice = 0;
    auto probe = *ProcessMemoryProbe::Create(options);
    absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(Spec(), 1 << 30, "");
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ(*(*session)->MeasurePeak(2), 7);
  }
}

TEST(ProbeDeviceOfTest, TheRoomiestGpuOfThisMachine) {
  auto device = [](const std::string& id, fitrun::v1::DeviceKind kind, int64_t total) {
    fitrun::v1::Device d;
    d.set_id(id);
    d.set_kind(kind);
    d.set_total_bytes(total);
    return d;
  };
  EXPECT_EQ(ProbeDeviceOf({}), "");
  EXPECT_EQ(ProbeDeviceOf({device("cpu:0", fitrun::v1::DEVICE_KIND_CPU, 8LL << 30)}), "");
  EXPECT_EQ(ProbeDeviceOf({device("cpu:0", fitrun::v1::DEVICE_KIND_CPU, 80LL << 30),
                           device("cuda:0#0", fitrun::v1::DEVICE_KIND_CUDA, 1LL << 30),
                           device("cuda:0#1", fitrun::v1::DEVICE_KIND_CUDA, 2LL << 30),
                           device("n1/cuda:0", fitrun::v1::DEVICE_KIND_CUDA, 80LL << 30)}),
            "cuda:0#1");
  // A cluster's GPUs are on its nodes: the coordinator's machine has none to probe on.
  EXPECT_EQ(ProbeDeviceOf({device("n1/cuda:0", fitrun::v1::DEVICE_KIND_CUDA, 80LL << 30)}), "");
}

TEST_F(ProcessMemoryProbeTest, AProbeRunsInACgroupOfItsOwnThatGoesWithItAndWhatItStarted) {
  ThrowawayCgroups throwaway("probe");
  if (!throwaway.available()) GTEST_SKIP() << throwaway.why();
  // A probe that leaves a daemon behind (setsid, its parent gone), as a script's probe could.
  const std::string seen = dir_.Join("probe_cgroup.txt");
  const std::string daemon_pid = dir_.Join("probe_daemon.pid");
  const std::string worker = FakeWorker("probe_cgroup.sh", absl::StrCat(R"(
grep -E ':(memory|pids):' /proc/self/cgroup > )", seen, R"(
setsid /bin/sh -c 'sleep 300 & echo $! > )", daemon_pid, R"('
echo '{"model_state_bytes": 100, "train_samples": 1000}'
while read b; do echo "{\"batch\": $b, \"peak_bytes\": 1000, \"backward_peak_bytes\": 1000, \"other_peak_bytes\": 0}"; done)"));
  ProcessMemoryProbe::Options options = OptionsFor(worker);
  options.cgroups = throwaway.cgroups();
  options.nice = 0;
  auto probe = *ProcessMemoryProbe::Create(options);
  fitrun::v1::JobSpec spec = Spec();
  spec.mutable_resources()->set_max_processes(40);
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(spec, 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(*(*session)->MeasurePeak(4), 1000);
  const std::string name = absl::StrCat("probe-", getpid(), "-0");
  absl::StatusOr<std::unique_ptr<JobCgroup>> cgroup = throwaway.cgroups()->Open(name);
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  // Bounded as a rank of the job: its budget plus what a process needs beside it, the spec's tasks.
  EXPECT_EQ((*cgroup)->ReadLimits()->memory_bytes, (int64_t{1} << 30) + (int64_t{2} << 30));
  EXPECT_EQ((*cgroup)->ReadLimits()->max_tasks, 40);
  std::ifstream in(seen);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("/" + name + "\n")) << "the probe did not run in its cgroup";
  std::string pid_text;
  for (int i = 0; i < 500 && pid_text.empty(); ++i) {
    std::ifstream pid_in(daemon_pid);
    std::getline(pid_in, pid_text);
    if (pid_text.empty()) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_FALSE(pid_text.empty());
  const int daemon = std::stoi(pid_text);
  EXPECT_EQ(kill(daemon, 0), 0);

  session->reset();
  // The daemon went with the probe (reaped by init, or a zombie awaiting it), and so did its cgroup.
  std::ifstream stat(absl::StrCat("/proc/", daemon, "/stat"));
  const std::string state((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(state.empty() || state.find(") Z ") != std::string::npos) << state;
  EXPECT_EQ(throwaway.Leftovers(), std::vector<std::string>{});
}

// A script the kernel kills at the probe's host memory limit has a batch that does not fit (as one
// past the device's budget), not a broken script: the sweep stops below it.
TEST_F(ProcessMemoryProbeTest, AScriptKilledAtTheHostMemoryLimitIsOverBudgetNotAFailure) {
  ThrowawayCgroups throwaway("probe-oom");
  if (!throwaway.available()) GTEST_SKIP() << throwaway.why();
  // Its "script" fills 64 MiB of host memory per sample, outside any device count; the worker reports
  // the script's end as fitrun-worker's script probe does.
  const std::string worker = FakeWorker("probe_host_oom.sh", R"SH(
echo '{"model_state_bytes": 0, "train_samples": 0}'
while read b; do
  if /usr/bin/python3 -c "import sys; x = b'\1' * ($b << 26)"; then
    echo "{\"batch\": $b, \"peak_bytes\": $((b * 1000)), \"backward_peak_bytes\": 0, \"other_peak_bytes\": 0}"
  else
    echo "{\"batch\": $b, \"error\": \"the script at micro-batch $b was killed by signal 9\", \"out_of_memory\": false}"
  fi
done)SH");
  ProcessMemoryProbe::Options options = OptionsFor(worker);
  options.cgroups = throwaway.cgroups();
  options.nice = 0;
  auto probe = *ProcessMemoryProbe::Create(options);
  fitrun::v1::JobSpec spec = Spec();
  spec.mutable_resources()->set_host_memory("256MiB");
  absl::StatusOr<std::unique_ptr<MemoryProbeSession>> session = probe->Start(spec, 1 << 30, "");
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(*(*session)->MeasurePeak(1), 1000);
  absl::StatusOr<int64_t> killed = (*session)->MeasurePeak(8);
  EXPECT_EQ(killed.status().code(), absl::StatusCode::kResourceExhausted) << killed.status();
  EXPECT_THAT(killed.status().message(), HasSubstr("micro-batch 8: the kernel's OOM killer stopped the script"));
  // The session goes on: the next batch is measured as before.
  EXPECT_EQ(*(*session)->MeasurePeak(2), 2000);
  session->reset();
  EXPECT_EQ(throwaway.Leftovers(), std::vector<std::string>{});
}

}  // namespace
}  // namespace fitrun::server
