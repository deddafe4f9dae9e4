// Admission on its own: the spec checked (data roots first, then validation and defaults, then the
// node bound), request ids bounded, and a retry that must carry the same spec.
#include "server/core/jobs/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "server/core/errors.h"
#include "server/core/jobs/test_jobs.h"
#include "server/core/specs/test_specs.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

TEST(AdmissionTest, ASpecNamingAFileOutsideTheDataRootsIsRefusedNamingTheField) {
  Admission::Options options;
  options.data_roots = DataRoots({::testing::TempDir()});
  const Admission admission(options);
  absl::StatusOr<fitrun::v1::JobSpec> spec = admission.CheckSpec(MlpTestSpec());  // Debian's datasets
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.data.path"));
}

TEST(AdmissionTest, ARankAskingForMoreThanTheOperatorsCeilingsIsRefusedNamingTheFlag) {
  Admission::Options options;
  options.max_rank_host_memory_bytes = int64_t{8} << 30;
  options.max_rank_processes = 1024;
  const Admission admission(options);
  fitrun::v1::JobSpec spec = MlpTestSpec();
  spec.mutable_resources()->set_host_memory("60GiB");
  absl::Status refused = admission.CheckSpec(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("spec.resources.host_memory"));
  EXPECT_THAT(refused.message(), HasSubstr("--max_rank_host_memory"));
  spec.mutable_resources()->set_host_memory("8GiB");
  spec.mutable_resources()->set_max_processes(100000);
  refused = admission.CheckSpec(spec).status();
  EXPECT_THAT(refused.message(), HasSubstr("spec.resources.max_processes"));
  EXPECT_THAT(refused.message(), HasSubstr("--max_rank_processes"));
  spec.mutable_resources()->set_max_processes(1024);
  EXPECT_TRUE(admission.CheckSpec(spec).ok()) << "at the ceilings is allowed";
}

TEST(AdmissionTest, ASystemAccountNeverRunsAUsersJob) {
  // "daemon" (uid 1) and "nobody" (65534) are in every Debian password database.
  const Admission admission({});
  const absl::Status refused = admission.CheckSpec(MlpTestSpec(), "daemon").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("--min_account_uid"));
  EXPECT_THAT(refused.message(), HasSubstr("'daemon' (uid 1"));
  EXPECT_TRUE(admission.CheckSpec(MlpTestSpec(), "nobody").ok());
  Admission::Options options;
  options.min_account_uid = 1;
  EXPECT_TRUE(Admission(options).CheckSpec(MlpTestSpec(), "daemon").ok()) << "the operator's flag decides";
}

TEST(AdmissionTest, KernelAndDeviceFilesAreRefusedByNameWhateverTheDataRoots) {
  Admission::Options options;
  options.data_roots = DataRoots({"/usr/share/datasets", "/proc", "/dev"});
  const Admission admission(options);
  for (const char* path : {"/proc/self/root/usr/share/datasets/fashion-mnist", "/proc/1/fd/0", "/dev/zero",
                           "/sys/kernel", "/usr/share/datasets/../../../proc/self"}) {
    fitrun::v1::JobSpec spec = MlpTestSpec();
    spec.mutable_data()->set_path(path);
    const absl::Status refused = admission.CheckSpec(spec).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(refused.message(), HasSubstr("kernel or device file")) << path;
  }
}

TEST(AdmissionTest, AValidSpecComesBackDefaultedAndAnInvalidOneNamesItsField) {
  const Admission admission({});
  fitrun::v1::JobSpec bare = MlpTestSpec();
  bare.clear_fault_tolerance();
  absl::StatusOr<fitrun::v1::JobSpec> spec = admission.CheckSpec(bare);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_GT(spec->fault_tolerance().max_restarts(), 0) << "defaults applied";

  fitrun::v1::JobSpec invalid = MlpTestSpec();
  invalid.mutable_optimizer()->set_lr(-1);
  EXPECT_THAT(admission.CheckSpec(invalid).status().message(), HasSubstr("spec.optimizer.lr"));
}

TEST(AdmissionTest, ASpecNeedingMoreNodesThanTheCoordinatorSpansSaysWhy) {
  Admission::Options options;
  options.max_nodes = 1;
  options.max_nodes_reason = "fitrund runs ranks on this machine only";
  const Admission admission(options);
  fitrun::v1::JobSpec spec = MlpTestSpec();
  spec.mutable_resources()->set_min_nodes(2);
  spec.mutable_resources()->set_max_nodes(2);
  const absl::Status status = admission.CheckSpec(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("spec.resources.min_nodes: 2 nodes, but fitrund runs ranks on this machine"));
}

TEST(AdmissionTest, RequestIdsAreBoundedTo128Characters) {
  EXPECT_TRUE(Admission::CheckRequestId("").ok());
  EXPECT_TRUE(Admission::CheckRequestId(std::string(128, 'r')).ok());
  EXPECT_THAT(Admission::CheckRequestId(std::string(129, 'r')).message(),
              HasSubstr("request_id: at most 128 characters (got 129)"));
}

TEST(AdmissionTest, ARetryMustCarryTheSameSpec) {
  fitrun::v1::Job earlier = JobOf("j-000001", "alice", "r1");
  *earlier.mutable_spec() = MlpTestSpec();
  EXPECT_TRUE(Admission::SameSubmit("r1", earlier, earlier.spec()).ok());
  fitrun::v1::JobSpec other = earlier.spec();
  other.set_global_batch_size(512);
  const absl::Status status = Admission::SameSubmit("r1", earlier, other);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("request_id: 'r1' already created job j-000001 with a different spec"));
}

}  // namespace
}  // namespace fitrun::server
