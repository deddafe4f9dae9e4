#include "server/slurm/slurm_text.h"
#include "server/slurm/recorded_output.h"


#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::server::slurm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string Line(const std::string& text, size_t index) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  return index < lines.size() ? lines[index] : "";
}

// --- ParseOneliner ----------------------------------------------------------------------------------

TEST(ParseOnelinerTest, RealNodeLineKeepsSpacesEqualsAndEmptyValues) {
  const auto fields = ParseOneliner(Line(Sample("scontrol_show_node_gpus.txt"), 0));
  EXPECT_EQ(fields.size(), 38u);  // As tests/slurm/cluster.py's parse_oneliner reads the same line.
  EXPECT_EQ(fields.at("NodeName"), "n1");
  EXPECT_EQ(fields.at("OS"), "Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0");  // then two spaces
  EXPECT_EQ(fields.at("CoresPerSocket"), "2");                                     // then two spaces
  EXPECT_EQ(fields.at("Partitions"), "debug");                                     // then two spaces
  EXPECT_EQ(fields.at("CfgTRES"), "cpu=2,mem=4G,billing=2");
  EXPECT_EQ(fields.at("AllocTRES"), "");
  EXPECT_EQ(fields.at("Gres"), "gpu:fake:2");
  EXPECT_EQ(fields.at("ExtSensorsTemp"), "n/s");
  EXPECT_EQ(fields.count("cpu"), 0u);  // a key inside a value is not a key
}

TEST(ParseOnelinerTest, RealJobLineReadsKeysWithColonsAndSlashes) {
  const auto fields = ParseOneliner(Sample("scontrol_show_job_running.txt"));
  EXPECT_EQ(fields.size(), 61u);  // As parse_oneliner reads it.
  EXPECT_EQ(fields.at("AllocNode:Sid"), "localhost:29378");
  EXPECT_EQ(fields.at("CPUs/Task"), "1");
  EXPECT_EQ(fields.at("ReqB:S:C:T"), "0:0:*:*");
  EXPECT_EQ(fields.at("NodeList"), "n[1-2]");
  EXPECT_EQ(fields.at("TresPerNode"), "gres:gpu:2");
  EXPECT_EQ(fields.at("Power"), "");  // the line ends "Power= TresPerNode=...", with a trailing space
  EXPECT_EQ(fields.at("UserId"), "root(0)");
}

TEST(ParseOnelinerTest, RealDrainReasonWithSpacesIsOneValue) {
  const auto fields = ParseOneliner(Line(Sample("scontrol_show_node_drain.txt"), 1));
  EXPECT_EQ(fields.size(), 39u);
  EXPECT_EQ(fields.at("State"), "IDLE+DRAIN");
  EXPECT_EQ(fields.at("Reason"), "fitrun test [root@2026-11-25T00:27:14]");
}

TEST(ParseOnelinerTest, OddLinesGiveWhatTheyHoldWithoutFailing) {
  EXPECT_THAT(ParseOneliner(""), IsEmpty());
  EXPECT_THAT(ParseOneliner("slurm_load_node error: Unable to contact slurm controller"), IsEmpty());
  EXPECT_THAT(ParseOneliner("=== =x"), IsEmpty());
  using Map = std::map<std::string, std::string>;
  EXPECT_EQ(ParseOneliner("junk before A=1"), (Map{{"A", "1"}}));
  EXPECT_EQ(ParseOneliner("A=1 A=2"), (Map{{"A", "2"}}));
  EXPECT_EQ(ParseOneliner("A= B=2\t"), (Map{{"A", ""}, {"B", "2"}}));
  EXPECT_EQ(ParseOneliner("A==b c 3=4 B_2/x:y=z"), (Map{{"A", "=b c 3=4"}, {"B_2/x:y", "z"}}));
  EXPECT_EQ(ParseOneliner("  Comment=two  words   Next=1  "), (Map{{"Comment", "two  words"}, {"Next", "1"}}));
}

// --- ParseGpuGres -----------------------------------------------------------------------------------

TEST(ParseGpuGresTest, NullOrEmptyIsNoGpus) {
  EXPECT_THAT(*ParseGpuGres("(null)"), IsEmpty());
  EXPECT_THAT(*ParseGpuGres(""), IsEmpty());
  EXPECT_THAT(*ParseGpuGres("mps:400,shard:8"), IsEmpty());
  EXPECT_THAT(*ParseGpuGres("gpu:a100:0"), IsEmpty());
}

TEST(ParseGpuGresTest, ReadsTypedUntypedAndSocketAnnotatedGpusAndIgnoresOtherGres) {
  EXPECT_THAT(*ParseGpuGres("gpu:fake:2"), ElementsAre(SlurmGpus{"fake", 2}));
  EXPECT_THAT(*ParseGpuGres("gpu:a100:2(S:0-1)"), ElementsAre(SlurmGpus{"a100", 2}));
  EXPECT_THAT(*ParseGpuGres("gpu:2"), ElementsAre(SlurmGpus{"", 2}));
  EXPECT_THAT(*ParseGpuGres("gpu"), ElementsAre(SlurmGpus{"", 1}));
  EXPECT_THAT(*ParseGpuGres("gpu:tesla:4,shard:8"), ElementsAre(SlurmGpus{"tesla", 4}));
  EXPECT_THAT(*ParseGpuGres("gpu:a100:no_consume:2"), ElementsAre(SlurmGpus{"a100", 2}));
  EXPECT_THAT(*ParseGpuGres("gpu:a100:2(S:0,2),mps:200,gpu:t4:1(S:1)"),
              ElementsAre(SlurmGpus{"a100", 2}, SlurmGpus{"t4", 1}));
}

TEST(ParseGpuGresTest, MalformedGpuEntryIsAnErrorQuotingIt) {
  for (const char* gres : {"gpu:a100:x:y", "gpu:a100:-1", "gpu:a:b:3"}) {
    absl::StatusOr<std::vector<SlurmGpus>> gpus = ParseGpuGres(gres);
    ASSERT_FALSE(gpus.ok()) << gres;
    EXPECT_EQ(gpus.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(gpus.status().message(), HasSubstr(absl::StrCat("Gres: '", gres, "'")));
  }
}

// --- ParseNodes -------------------------------------------------------------------------------------

TEST(ParseNodesTest, RealIdleGpuNodes) {
  absl::StatusOr<std::vector<SlurmNode>> nodes = ParseNodes(Sample("scontrol_show_node_gpus.txt"));
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  const SlurmNode& n1 = (*nodes)[0];
  EXPECT_EQ(n1.name, "n1");
  EXPECT_EQ(n1.addr, "127.0.0.2");
  EXPECT_EQ(n1.state, "IDLE");
  EXPECT_EQ(n1.cpus, 2);
  EXPECT_EQ(n1.real_memory_bytes, 4096LL << 20);
  EXPECT_THAT(n1.gpus, ElementsAre(SlurmGpus{"fake", 2}));
  EXPECT_THAT(n1.partitions, ElementsAre("debug"));
  EXPECT_TRUE(n1.Usable());
  EXPECT_EQ((*nodes)[1].name, "n2");
  EXPECT_EQ((*nodes)[1].addr, "127.0.0.3");
  EXPECT_TRUE((*nodes)[1].Usable());
}

TEST(ParseNodesTest, RealAllocatedAndMixedNodesAreUsable) {
  absl::StatusOr<std::vector<SlurmNode>> allocated = ParseNodes(Sample("scontrol_show_node_allocated.txt"));
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  ASSERT_EQ(allocated->size(), 2u);
  EXPECT_EQ((*allocated)[0].state, "ALLOCATED");
  EXPECT_TRUE((*allocated)[0].Usable());

  absl::StatusOr<std::vector<SlurmNode>> mixed = ParseNodes(Sample("scontrol_show_node_no_gres.txt"));
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->size(), 1u);
  EXPECT_EQ((*mixed)[0].state, "MIXED");
  EXPECT_THAT((*mixed)[0].gpus, IsEmpty());  // Gres=(null)
  EXPECT_TRUE((*mixed)[0].Usable());
}

TEST(ParseNodesTest, RealDrainedAndDownNodesAreNotUsable) {
  absl::StatusOr<std::vector<SlurmNode>> drain = ParseNodes(Sample("scontrol_show_node_drain.txt"));
  ASSERT_TRUE(drain.ok()) << drain.status();
  ASSERT_EQ(drain->size(), 2u);
  EXPECT_TRUE((*drain)[0].Usable());
  EXPECT_EQ((*drain)[1].state, "IDLE+DRAIN");
  EXPECT_FALSE((*drain)[1].Usable());

  absl::StatusOr<std::vector<SlurmNode>> down = ParseNodes(Sample("scontrol_show_node_down.txt"));
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ((*down)[1].state, "DOWN+DRAIN");
  EXPECT_FALSE((*down)[1].Usable());
}

TEST(ParseNodesTest, NoNodesAndBlankLinesGiveAnEmptyList) {
  EXPECT_THAT(*ParseNodes(""), IsEmpty());
  EXPECT_THAT(*ParseNodes("\n  \n"), IsEmpty());
  EXPECT_THAT(*ParseNodes("No nodes in the system\n"), IsEmpty());
}

TEST(ParseNodesTest, UnknownKeysIgnoredAndMissingOptionalKeysDefaulted) {
  absl::StatusOr<std::vector<SlurmNode>> nodes =
      ParseNodes("\r\nNodeName=x9 FancyNewKey=what ever State=IDLE CPUTot=8 CPUEfctv=6\r\n\n");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 1u);
  const SlurmNode& node = (*nodes)[0];
  EXPECT_EQ(node.addr, "x9");  // Slurm's default NodeAddr is the name
  EXPECT_EQ(node.cpus, 6);     // CPUEfctv: what jobs may use
  EXPECT_EQ(node.real_memory_bytes, 0);
  EXPECT_THAT(node.gpus, IsEmpty());
  EXPECT_THAT(node.partitions, IsEmpty());

  absl::StatusOr<std::vector<SlurmNode>> older = ParseNodes("NodeName=a CPUTot=4 State=MIXED Partitions=gpu,debug");
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ((*older)[0].cpus, 4);
  EXPECT_THAT((*older)[0].partitions, ElementsAre("gpu", "debug"));
}

TEST(ParseNodesTest, MissingOrMalformedRequiredKeysNameLineNodeAndKey) {
  struct Case {
    std::string text;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"NodeName=a State=IDLE CPUTot=2\nNodeName=b CPUTot=2", {"line 2", "node b", "State="}},
      {"NodeName=a State=IDLE", {"line 1", "node a", "CPUTot="}},
      {"NodeName=a State=IDLE CPUTot=lots", {"node a", "CPUTot='lots'"}},
      {"NodeName=a State=IDLE CPUTot=2 RealMemory=4G", {"node a", "RealMemory='4G'"}},
      {"NodeName=a State=IDLE CPUTot=2 Gres=gpu:a100:two:x", {"node a", "Gres: 'gpu:a100:two:x'"}},
      {"NodeName=a State=IDLE CPUTot=2\n%%% garbage %%%\n", {"line 2", "no NodeName=", "garbage"}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<SlurmNode>> nodes = ParseNodes(c.text);
    ASSERT_FALSE(nodes.ok()) << c.text;
    EXPECT_EQ(nodes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(nodes.status().message(), HasSubstr("scontrol show node"));
    for (const std::string& part : c.expected) EXPECT_THAT(nodes.status().message(), HasSubstr(part)) << c.text;
  }
}

SlurmNode NodeIn(const char* state) {
  SlurmNode node;
  node.state = state;
  return node;
}

TEST(SlurmNodeTest, UsableOnlyWhenNoStateFlagSaysOtherwise) {
  for (const char* state : {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "IDLE+CLOUD", "MIXED+PLANNED",
                            "idle", "ALLOCATED+RESERVED"}) {
    EXPECT_TRUE(NodeIn(state).Usable()) << state;
  }
  for (const char* state :
       {"", "DOWN", "DOWN*", "IDLE*", "IDLE+DRAIN", "MIXED+DRAIN", "DRAINED", "DRAINING", "DOWN+DRAIN", "FAIL",
        "MIXED+FAIL", "IDLE+NOT_RESPONDING", "IDLE+POWERED_DOWN", "IDLE+CLOUD+POWERED_DOWN", "IDLE+POWER_DOWN",
        "IDLE+POWERING_DOWN", "FUTURE", "IDLE+MAINT", "UNKNOWN", "IDLE~", "IDLE%", "ALLOCATED$", "INVAL"}) {
    EXPECT_FALSE(NodeIn(state).Usable()) << state;
  }
}

// --- Jobs -------------------------------------------------------------------------------------------

SlurmJobStatus ShowJob(const std::string& sample) {
  absl::StatusOr<SlurmJobStatus> job = ParseShowJob(Sample(sample));
  EXPECT_TRUE(job.ok()) << sample << ": " << job.status();
  return job.value_or(SlurmJobStatus{});
}

TEST(ParseShowJobTest, RealPendingJobsWaitWithTheirReason) {
  const SlurmJobStatus resources = ShowJob("scontrol_show_job_pending.txt");
  EXPECT_EQ(resources.id, "5");
  EXPECT_EQ(resources.state, "PENDING");
  EXPECT_EQ(resources.reason, "Resources");
  EXPECT_EQ(resources.nodes, "");
  EXPECT_TRUE(resources.Pending());
  EXPECT_FALSE(resources.Ended());

  const SlurmJobStatus too_big = ShowJob("scontrol_show_job_pending_node_limit.txt");
  EXPECT_EQ(too_big.reason, "PartitionNodeLimit");
  EXPECT_TRUE(too_big.Pending());
}

TEST(ParseShowJobTest, RealRunningJobHasItsNodesAndNoReason) {
  const SlurmJobStatus job = ShowJob("scontrol_show_job_running.txt");
  EXPECT_EQ(job.id, "4");
  EXPECT_EQ(job.state, "RUNNING");
  EXPECT_EQ(job.reason, "");  // Slurm says "None"
  EXPECT_EQ(job.nodes, "n[1-2]");
  EXPECT_FALSE(job.Pending());
  EXPECT_FALSE(job.Ended());
}

TEST(ParseShowJobTest, RealEndedJobsCarryExitCodeAndSignal) {
  const SlurmJobStatus completed = ShowJob("scontrol_show_job_completed.txt");
  EXPECT_EQ(completed.state, "COMPLETED");
  EXPECT_EQ(completed.nodes, "n1");
  EXPECT_EQ(completed.exit_code, 0);
  EXPECT_EQ(completed.exit_signal, 0);
  EXPECT_TRUE(completed.Ended());

  const SlurmJobStatus failed = ShowJob("scontrol_show_job_failed.txt");  // exit 3
  EXPECT_EQ(failed.state, "FAILED");
  EXPECT_EQ(failed.reason, "NonZeroExitCode");
  EXPECT_EQ(failed.exit_code, 3);
  EXPECT_EQ(failed.exit_signal, 0);
  EXPECT_TRUE(failed.Ended());

  // The batch script killed itself with SIGKILL: Slurm calls that a launch failure.
  const SlurmJobStatus signaled = ShowJob("scontrol_show_job_signaled.txt");
  EXPECT_EQ(signaled.state, "FAILED");
  EXPECT_EQ(signaled.reason, "JobLaunchFailure");
  EXPECT_EQ(signaled.exit_code, 0);
  EXPECT_EQ(signaled.exit_signal, 9);

  const SlurmJobStatus cancelled = ShowJob("scontrol_show_job_cancelled.txt");  // scancel of a running job
  EXPECT_EQ(cancelled.state, "CANCELLED");
  EXPECT_EQ(cancelled.reason, "");
  EXPECT_EQ(cancelled.exit_signal, 15);
  EXPECT_EQ(cancelled.nodes, "n[1-2]");
  EXPECT_TRUE(cancelled.Ended());

  const SlurmJobStatus cancelled_pending = ShowJob("scontrol_show_job_cancelled_pending.txt");
  EXPECT_EQ(cancelled_pending.state, "CANCELLED");
  EXPECT_EQ(cancelled_pending.reason, "PartitionNodeLimit");  // the reason it waited stays
  EXPECT_EQ(cancelled_pending.nodes, "");
  EXPECT_TRUE(cancelled_pending.Ended());
}

TEST(ParseShowJobTest, OddJobLines) {
  absl::StatusOr<SlurmJobStatus> words = ParseShowJob("JobId=7 JobState=CANCELLED by 0 Unknown=x");
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(words->state, "CANCELLED");
  EXPECT_EQ(words->exit_code, 0);  // no ExitCode=: 0:0

  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"", "no output"},
           {"slurm_load_jobs error: Invalid job id specified", "no JobId="},
           {"JobId=7 Reason=None", "no JobState="},
           {"JobId=7 JobState=FAILED ExitCode=3", "ExitCode='3'"},
           {"JobId=7 JobState=FAILED ExitCode=a:b", "ExitCode='a:b'"},
       }) {
    absl::StatusOr<SlurmJobStatus> job = ParseShowJob(text);
    ASSERT_FALSE(job.ok()) << text;
    EXPECT_THAT(job.status().message(), HasSubstr(expected)) << text;
  }
}

SlurmJobStatus JobIn(const char* state) {
  SlurmJobStatus job;
  job.state = state;
  return job;
}

TEST(SlurmJobStatusTest, EndedAndPendingFollowSlurmsStates) {
  for (const char* state : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                            "BOOT_FAIL", "DEADLINE"}) {
    EXPECT_TRUE(JobIn(state).Ended()) << state;
    EXPECT_FALSE(JobIn(state).Pending()) << state;
  }
  for (const char* state : {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD"}) {
    EXPECT_TRUE(JobIn(state).Pending()) << state;
    EXPECT_FALSE(JobIn(state).Ended()) << state;
  }
  for (const char* state : {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING"}) {
    EXPECT_FALSE(JobIn(state).Pending()) << state;
    EXPECT_FALSE(JobIn(state).Ended()) << state;
  }
}

TEST(ParseSqueueTest, RealQueueOfEveryKindOfJob) {
  absl::StatusOr<std::vector<SlurmJobStatus>> jobs = ParseSqueue(Sample("squeue_busy.txt"));
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::vector<std::string> rows;
  for (const SlurmJobStatus& job : *jobs) {
    rows.push_back(absl::StrCat(job.id, " ", job.state, " '", job.reason, "' '", job.nodes, "'",
                                job.Pending() ? " pending" : "", job.Ended() ? " ended" : ""));
  }
  EXPECT_THAT(rows, ElementsAre("1 COMPLETED '' 'n1' ended", "2 FAILED 'NonZeroExitCode' 'n1' ended",
                                "3 FAILED 'JobLaunchFailure' 'n2' ended", "5 PENDING 'Resources' '' pending",
                                "6 PENDING 'PartitionNodeLimit' '' pending", "4 RUNNING '' 'n[1-2]'"));

  absl::StatusOr<std::vector<SlurmJobStatus>> ended = ParseSqueue(Sample("squeue_ended.txt"));
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->size(), 6u);
  for (const SlurmJobStatus& job : *ended) EXPECT_TRUE(job.Ended()) << job.id << " " << job.state;
}

TEST(ParseSqueueTest, EmptyQueueAndOddLines) {
  EXPECT_THAT(*ParseSqueue(""), IsEmpty());
  EXPECT_THAT(*ParseSqueue("\n\n"), IsEmpty());
  absl::StatusOr<std::vector<SlurmJobStatus>> words = ParseSqueue("12_3|CANCELLED by 0|(null)|\n");
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ((*words)[0].id, "12_3");
  EXPECT_EQ((*words)[0].state, "CANCELLED");
  EXPECT_EQ((*words)[0].reason, "");

  for (const char* text : {"1|RUNNING|None\n", "1 RUNNING None n1", "1|RUNNING|None|n1\n|PENDING|x|", "1|x|y|z|w"}) {
    absl::StatusOr<std::vector<SlurmJobStatus>> jobs = ParseSqueue(text);
    ASSERT_FALSE(jobs.ok()) << text;
    EXPECT_THAT(jobs.status().message(), HasSubstr("squeue: line "));
    EXPECT_THAT(jobs.status().message(), HasSubstr(absl::StrCat("--format=", kSqueueFormat)));
  }
  EXPECT_THAT(ParseSqueue("1|RUNNING|None|n1\n|PENDING|x|").status().message(), HasSubstr("line 2"));
}

TEST(ParseSbatchParsableTest, RealAndClusterQualifiedIds) {
  EXPECT_EQ(*ParseSbatchParsable(Sample("sbatch_parsable.txt")), "1");
  EXPECT_EQ(*ParseSbatchParsable("12345;cluster-a\n"), "12345");
  for (const char* out : {"", "\n", "abc", "Submitted batch job 5", "12a", ";cluster"}) {
    absl::StatusOr<std::string> id = ParseSbatchParsable(out);
    ASSERT_FALSE(id.ok()) << out;
    EXPECT_THAT(id.status().message(), HasSubstr("sbatch --parsable: expected a job id"));
  }
}

// --- Flags ------------------------------------------------------------------------------------------

TEST(ParseGpuMemoryFlagTest, EmptyFlagIsAnEmptyTable) { EXPECT_THAT(*ParseGpuMemoryFlag(""), IsEmpty()); }

TEST(ParseGpuMemoryFlagTest, ReadsTypesAndSizes) {
  absl::StatusOr<std::map<std::string, int64_t>> table = ParseGpuMemoryFlag("a100=80GiB,t4=16GiB,gpu=512MiB");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(*table, (std::map<std::string, int64_t>{{"a100", 80LL << 30}, {"t4", 16LL << 30}, {"gpu", 512LL << 20}}));
}

TEST(ParseGpuMemoryFlagTest, ErrorsNameTheFlagAndShowTheForm) {
  for (const auto& [flag, expected] : std::vector<std::pair<std::string, std::string>>{
           {"a100", "'a100' is not TYPE=SIZE"},
           {"=80GiB", "'=80GiB' is not TYPE=SIZE"},
           {"a100=lots", "GPU type 'a100': 'lots' is not a size"},
           {"a100=80GiB,a100=40GiB", "'a100' is given twice"},
       }) {
    absl::StatusOr<std::map<std::string, int64_t>> table = ParseGpuMemoryFlag(flag);
    ASSERT_FALSE(table.ok()) << flag;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr("--slurm_gpu_memory: "));
    EXPECT_THAT(table.status().message(), HasSubstr(expected));
  }
  EXPECT_THAT(ParseGpuMemoryFlag("a100").status().message(), HasSubstr("--slurm_gpu_memory=a100=80GiB"));
}

TEST(ParseVirtualDevicesFlagTest, ReadsCountAndSize) {
  absl::StatusOr<std::pair<int, int64_t>> devices = ParseVirtualDevicesFlag("2x1GiB");
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_EQ(devices->first, 2);
  EXPECT_EQ(devices->second, 1LL << 30);
}

TEST(ParseVirtualDevicesFlagTest, ErrorsNameTheFlag) {
  for (const char* flag : {"", "2", "x1GiB", "0x1GiB", "2000x1GiB", "2x", "2xlots", "2X1GiB"}) {
    absl::StatusOr<std::pair<int, int64_t>> devices = ParseVirtualDevicesFlag(flag);
    ASSERT_FALSE(devices.ok()) << flag;
    EXPECT_THAT(devices.status().message(), HasSubstr("--slurm_virtual_devices: ")) << flag;
  }
}

}  // namespace
}  // namespace fitrun::server::slurm
