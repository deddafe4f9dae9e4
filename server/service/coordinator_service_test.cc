// The gRPC adapters against a real JobManager (fake store, launcher and devices) on 127.0.0.1:
// batched reports become one store transaction, WatchJobEvents delivers events a batch per
// message, and a watcher that stops reading is told what it missed while ingest goes on.
#include "server/service/coordinator_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "fitrun/v1/worker.grpc.pb.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/service/worker_channel_service.h"

namespace fitrun::server {
namespace {

using fitrun::v1::JobEvent;
using fitrun::v1::JobEventBatch;
using fitrun::v1::WorkerReport;

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/coordinator-service-", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    JobManager::Options options;
    options.state_dir = dir_;
    options.worker_binary = "/bin/true";
    options.max_events_per_job = 0;  // a stalled watcher falls far behind: more events than the cap
    auto manager = JobManager::Create(options, &store_, &devices_, &launcher_, &metrics_);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
    coordinator_ = std::make_unique<CoordinatorService>(manager_.get());
    workers_ = std::make_unique<WorkerChannelService>(manager_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(coordinator_.get());
    builder.RegisterService(workers_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);

    absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(MlpSpec("svc", 64, 1000000000, 1, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->id();
    ASSERT_TRUE(launcher_.WaitForLaunches(1, absl::Seconds(10)));
    token_ = launcher_.launches()[0].job_token;
    // The launcher returns before the manager records the job RUNNING, an event of its own: the tests
    // count the events after it.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (manager_->Get(job_id_).value().state() != fitrun::v1::JOB_STATE_RUNNING) {
      ASSERT_LT(absl::Now(), deadline) << "the job never became RUNNING";
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  void TearDown() override {
    if (manager_ != nullptr) (void)manager_->Cancel(job_id_, "test done");
    if (server_ != nullptr) server_->Shutdown();
    if (manager_ != nullptr) manager_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  // A rank stream that has sent its Hello.
  struct Rank {
    grpc::ClientContext context;
    std::unique_ptr<fitrun::v1::WorkerChannel::Stub> stub;
    std::unique_ptr<grpc::ClientReaderWriter<WorkerReport, fitrun::v1::WorkerCommand>> stream;
  };
  std::unique_ptr<Rank> ConnectRank0() {
    auto rank = std::make_unique<Rank>();
    rank->stub = fitrun::v1::WorkerChannel::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    rank->stream = rank->stub->Connect(&rank->context);
    WorkerReport hello;
    hello.mutable_hello()->set_job_id(job_id_);
    hello.mutable_hello()->set_attempt(1);
    hello.mutable_hello()->set_rank(0);
    hello.mutable_hello()->set_world_size(1);
    hello.mutable_hello()->set_job_token(token_);
    EXPECT_TRUE(rank->stream->Write(hello));
    return rank;
  }

  static WorkerReport ProgressBatch(int first_step, int count) {
    WorkerReport message;
    for (int i = 0; i < count; ++i) message.mutable_batch()->add_reports()->mutable_progress()->set_step(first_step + i);
    return message;
  }

  bool WaitForSequence(int64_t sequence, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (manager_->events().LastSequence(job_id_) < sequence) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

  std::string dir_;
  FakeJobStore store_;
  FakeDeviceInventory devices_{2, 16LL << 30};
  FakeWorkerLauncher launcher_;
  NoopCoordinatorMetrics metrics_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::unique_ptr<WorkerChannelService> workers_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::string job_id_;
  std::string token_;
};

TEST_F(CoordinatorServiceTest, AReportBatchIsOneStoreTransactionAndArrivesInOrder) {
  std::unique_ptr<Rank> rank = ConnectRank0();
  const int64_t before = manager_->events().LastSequence(job_id_);
  const int batches_before = store_.append_batches();
  ASSERT_TRUE(rank->stream->Write(ProgressBatch(1, 50)));
  ASSERT_TRUE(WaitForSequence(before + 50, absl::Seconds(10)));
  EXPECT_EQ(store_.append_batches(), batches_before + 1);
  absl::StatusOr<std::vector<JobEvent>> stored = store_.ReadEvents(job_id_, before + 1, 100);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ((*stored)[i].sequence(), before + 1 + i);
    EXPECT_EQ((*stored)[i].progress().step(), 1 + i);
  }
  rank->stream->WritesDone();
}

TEST_F(CoordinatorServiceTest, WatchJobEventsReplaysAndFollowsSeveralEventsToAMessage) {
  std::unique_ptr<Rank> rank = ConnectRank0();
  ASSERT_TRUE(rank->stream->Write(ProgressBatch(1, 300)));
  ASSERT_TRUE(WaitForSequence(300, absl::Seconds(10)));

  auto stub = fitrun::v1::Coordinator::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  fitrun::v1::WatchJobRequest request;
  request.set_job_id(job_id_);
  request.set_from_sequence(1);
  auto reader = stub->WatchJobEvents(&context, request);
  // Then more, live, while it watches.
  ASSERT_TRUE(rank->stream->Write(ProgressBatch(301, 300)));
  std::vector<int64_t> sequences;
  int messages = 0;
  JobEventBatch batch;
  while (reader->Read(&batch)) {
    ++messages;
    for (const JobEvent& event : batch.events()) {
      ASSERT_FALSE(event.has_missed());
      ASSERT_EQ(event.job_id(), job_id_);
      sequences.push_back(event.sequence());
    }
    if (!sequences.empty() && sequences.back() >= manager_->events().LastSequence(job_id_) &&
        manager_->events().LastSequence(job_id_) >= 600) {
      break;
    }
  }
  context.TryCancel();
  reader->Finish();
  ASSERT_FALSE(sequences.empty());
  for (size_t i = 0; i < sequences.size(); ++i) ASSERT_EQ(sequences[i], static_cast<int64_t>(i + 1));
  EXPECT_GE(sequences.back(), 600);
  // Batched: far fewer messages than events.
  EXPECT_LT(messages * 4, static_cast<int>(sequences.size()));
  rank->stream->WritesDone();
}

// A watcher that stops reading holds nothing up: ingest runs to the end, and when the watcher
// reads again it is told which sequences it missed and goes on from what is still buffered, so
// what it saw plus what it was told it missed is every sequence exactly once.
TEST_F(CoordinatorServiceTest, AStalledWatcherIsToldWhatItMissedAndIngestNeverWaits) {
  std::unique_ptr<Rank> rank = ConnectRank0();
  const int64_t first = manager_->events().LastSequence(job_id_) + 1;
  auto stub = fitrun::v1::Coordinator::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  fitrun::v1::WatchJobRequest request;
  request.set_job_id(job_id_);
  request.set_from_sequence(first);
  auto reader = stub->WatchJobEvents(&context, request);
  ASSERT_TRUE(rank->stream->Write(ProgressBatch(0, 10)));
  JobEventBatch batch;
  ASSERT_TRUE(reader->Read(&batch));  // it is following the live tail now
  int64_t next = first;
  for (const JobEvent& event : batch.events()) {
    ASSERT_EQ(event.sequence(), next);
    ++next;
  }

  // Far more than the coordinator buffers (and than flow control lets through) while it does not read.
  constexpr int kEvents = 200000;
  for (int sent = 0; sent < kEvents; sent += 1000) ASSERT_TRUE(rank->stream->Write(ProgressBatch(10 + sent, 1000)));
  const int64_t last = first + 10 + kEvents - 1;
  ASSERT_TRUE(WaitForSequence(last, absl::Seconds(60))) << "ingest waited for a watcher that does not read";

  int64_t missed = 0;
  while (next <= last && reader->Read(&batch)) {
    for (const JobEvent& event : batch.events()) {
      if (event.has_missed()) {
        EXPECT_EQ(event.sequence(), 0);
        ASSERT_EQ(event.missed().first_sequence(), next);
        ASSERT_GE(event.missed().last_sequence(), next);
        missed += event.missed().last_sequence() - event.missed().first_sequence() + 1;
        next = event.missed().last_sequence() + 1;
        continue;
      }
      ASSERT_EQ(event.sequence(), next);
      ++next;
    }
  }
  EXPECT_EQ(next, last + 1);
  EXPECT_GT(missed, 0);
  context.TryCancel();
  reader->Finish();
  rank->stream->WritesDone();
}

}  // namespace
}  // namespace fitrun::server
