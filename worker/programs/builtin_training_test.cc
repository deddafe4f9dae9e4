// The built-in training program as one rank, in this process, against a fake coordinator: wherever
// the device's memory runs out before training (the model's state, the reducer's buckets), the rank
// reports an OutOfMemory and ends with exit code 3, as it does in a step. A capped CPU allocator is
// the full device. A process runs one rank (LibTorch sets its thread pools once): BUILD runs each
// test in a binary of its own.
#include "worker/programs/builtin_training.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/contract/launch_contract.h"
#include "worker/data/test_files.h"
#include "worker/models/model.h"
#include "worker/report/fake_coordinator.h"
#include "worker/runtime/rank_runtime.h"
#include "proto/contract/free_port.h"

namespace fitrun::worker {
namespace {

constexpr int kTrainSamples = 256;

class BuiltinTrainingOutOfMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string data_dir = testing::MakeTempDir("fashion_mnist");
    testing::WriteFakeFashionMnist(data_dir, kTrainSamples, 16);
    assignment_path_ = testing::MakeTempDir("assignment") + "/assignment.textproto";
    assignment_.set_job_id("job-1");
    assignment_.set_attempt(1);
    fitrun::v1::JobSpec* spec = assignment_.mutable_spec();
    spec->mutable_model()->set_builtin("mlp");
    spec->mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
    spec->mutable_data()->set_path(data_dir);
    spec->mutable_optimizer()->set_kind(fitrun::v1::OPTIMIZER_KIND_SGD);
    spec->set_seed(4);
    fitrun::v1::Plan* plan = assignment_.mutable_plan();
    plan->add_device_ids("cpu:0");
    plan->set_per_device_batch(32);
    plan->set_grad_accum_steps(1);
    plan->set_learning_rate(0.05);
    plan->set_total_steps(2);
    assignment_.add_cpu_threads(1);
    server_ = coordinator_.Serve(&coordinator_port_);
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs the rank on a virtual CPU device of `cap_bytes`; its exit code.
  int RunRank(int64_t cap_bytes) {
    assignment_.add_memory_cap_bytes(cap_bytes);
    std::string text;
    google::protobuf::TextFormat::PrintToString(assignment_, &text);
    std::ofstream(assignment_path_) << text;
    WorkerOptions options;
    options.master_addr = "127.0.0.1";
    options.master_port = fitrun::contract::PickFreeLoopbackPort().value();
    options.assignment_path = assignment_path_;
    options.coordinator = absl::StrCat("127.0.0.1:", coordinator_port_);
    options.job_id = "job-1";
    options.attempt = 1;
    options.job_token = "token-1";
    RankRuntime runtime(options);
    if (absl::Status started = runtime.Start(); !started.ok()) {
      ADD_FAILURE() << started;
      return -1;
    }
    return MakeBuiltinTraining(options)->Run(runtime);
  }

  // The OutOfMemory the rank reported, and the reason of its RankFailed after it.
  void ExpectOutOfMemory(int64_t cap_bytes, const std::string& reason) {
    const std::vector<fitrun::v1::WorkerReport> reports = coordinator_.reports();
    auto oom = std::find_if(reports.begin(), reports.end(), [](const auto& r) { return r.has_oom(); });
    ASSERT_NE(oom, reports.end()) << "no OutOfMemory report";
    EXPECT_EQ(oom->oom().step(), 0) << "before the first step";
    EXPECT_EQ(oom->oom().per_device_batch(), 32);
    EXPECT_EQ(oom->oom().cap_bytes(), cap_bytes);
    EXPECT_GT(oom->oom().requested_bytes(), 0);
    EXPECT_GT(oom->oom().live_bytes() + oom->oom().requested_bytes(), cap_bytes);
    auto failed = std::find_if(oom, reports.end(), [](const auto& r) { return r.has_failed(); });
    ASSERT_NE(failed, reports.end()) << "no RankFailed after the OutOfMemory";
    EXPECT_TRUE(absl::StrContains(failed->failed().reason(), reason)) << failed->failed().reason();
  }

  fitrun::v1::WorkerAssignment assignment_;
  std::string assignment_path_;
  FakeCoordinator coordinator_;
  int coordinator_port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// The model's weights move onto the device first (onto a GPU with model->to(device), into a virtual
// CPU device's allocator here): a device they do not fit is an OOM, not a configuration error.
TEST_F(BuiltinTrainingOutOfMemoryTest, AModelThatDoesNotFitTheDeviceIsAnOutOfMemory) {
  constexpr int64_t kCap = 64 << 10;
  EXPECT_EQ(RunRank(kCap), fitrun::contract::launch::kExitOutOfMemory);
  ExpectOutOfMemory(kCap, "out of device memory: CPU device memory cap exceeded");
}

// The weights and the broadcast's flat copy of them fit; the reducer's buckets, as large as the
// gradients, do not: an OOM, where the exception used to end the process.
TEST_F(BuiltinTrainingOutOfMemoryTest, BucketsThatDoNotFitTheDeviceAreAnOutOfMemory) {
  absl::StatusOr<std::shared_ptr<Model>> model = CreateModel(assignment_.spec().model(), 4);
  ASSERT_TRUE(model.ok()) << model.status();
  int64_t weights = 0;
  for (const at::Tensor& p : (*model)->parameters()) weights += p.numel() * static_cast<int64_t>(sizeof(float));
  const int64_t cap = 2 * weights + 2;  // the buckets add the gradients' size and the loss's 4 bytes
  EXPECT_EQ(RunRank(cap), fitrun::contract::launch::kExitOutOfMemory);
  ExpectOutOfMemory(cap, "allocating the gradient buckets");
}

}  // namespace
}  // namespace fitrun::worker
