// Runs the real gRPC client against a small in-process Coordinator on a port the OS picks, to check
// what crosses the wire: the request fields, streamed events and error codes.
#include "client/grpc_coordinator_client.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

using ::testing::ElementsAre;

// Answers from fixed data and records requests. gRPC calls it on its own threads, but each test
// makes one call at a time and reads the records only after the call returned.
class ScriptedCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    submitted_yaml = request->spec_yaml();
    if (request->spec_yaml().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "spec: empty");
    }
    response->mutable_job()->set_id("j-1");
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    if (request->job_id() != "j-1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("job ", request->job_id(), " not found"));
    }
    response->set_id("j-1");
    response->set_state(v1::JOB_STATE_SUCCEEDED);
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override {
    cancel_reason = request->reason();
    response->mutable_job()->set_id(request->job_id());
    response->mutable_job()->set_state(v1::JOB_STATE_CANCELLED);
    return grpc::Status::OK;
  }

  // Sends the events two to a message, so the client must unpack batches in order. Job "running"
  // then waits for events that never come, as a running job's stream does, until the client
  // cancels.
  grpc::Status WatchJobEvents(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                              grpc::ServerWriter<v1::JobEventBatch>* writer) override {
    watch_from = request->from_sequence();
    v1::JobEventBatch batch;
    for (int64_t sequence = request->from_sequence(); sequence <= 5; ++sequence) {
      v1::JobEvent* event = batch.add_events();
      event->set_job_id(request->job_id());
      event->set_sequence(sequence);
      event->mutable_progress()->set_step(sequence * 10);
      if (batch.events_size() == 2) {
        writer->Write(batch);
        batch.Clear();
      }
    }
    if (batch.events_size() > 0) writer->Write(batch);
    if (request->job_id() == "running") {
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (!context->IsCancelled() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
      if (context->IsCancelled()) watch_cancelled.Notify();
      return grpc::Status::CANCELLED;
    }
    if (request->job_id() == "broken") {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
    }
    return grpc::Status::OK;
  }

  std::string submitted_yaml;
  std::string cancel_reason;
  int64_t watch_from = -1;
  absl::Notification watch_cancelled;
};

class GrpcCoordinatorClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> client =
        GrpcCoordinatorClient::Create({absl::StrCat("127.0.0.1:", port), absl::Seconds(10)});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  ScriptedCoordinator service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcCoordinatorClient> client_;
};

TEST_F(GrpcCoordinatorClientTest, SubmitSendsYaml) {
  absl::StatusOr<v1::Job> job = client_->SubmitJob("name: a\n");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "j-1");
  EXPECT_EQ(service_.submitted_yaml, "name: a\n");
}

TEST_F(GrpcCoordinatorClientTest, ErrorsKeepCodeAndMessage) {
  absl::StatusOr<v1::Job> job = client_->SubmitJob("");
  EXPECT_EQ(job.status(), absl::InvalidArgumentError("spec: empty"));
  EXPECT_EQ(client_->GetJob("j-2").status(), absl::NotFoundError("job j-2 not found"));
  // Not implemented by the scripted service.
  EXPECT_EQ(client_->ListJobs({}).status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(GrpcCoordinatorClientTest, CancelSendsTheReason) {
  absl::StatusOr<v1::Job> job = client_->CancelJob("j-1", "enough");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(service_.cancel_reason, "enough");
}

TEST_F(GrpcCoordinatorClientTest, WatchStreamsFromTheRequestedSequence) {
  std::vector<int64_t> sequences;
  absl::Status status = client_->WatchJob(
      "j-1", 3, [&](const v1::JobEvent& event) { sequences.push_back(event.sequence()); });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(service_.watch_from, 3);
  EXPECT_THAT(sequences, ElementsAre(3, 4, 5));
}

TEST_F(GrpcCoordinatorClientTest, WatchReportsWhyTheStreamBroke) {
  std::vector<int64_t> sequences;
  absl::Status status = client_->WatchJob(
      "broken", 1, [&](const v1::JobEvent& event) { sequences.push_back(event.sequence()); });
  EXPECT_EQ(status, absl::UnavailableError("coordinator shutting down"));
  EXPECT_THAT(sequences, ElementsAre(1, 2, 3, 4, 5));
}

TEST_F(GrpcCoordinatorClientTest, ReadJobEventsStopsARunningJobsStreamAtTheLastSequenceWanted) {
  std::vector<int64_t> sequences;
  const absl::Time start = absl::Now();
  absl::Status status = client_->ReadJobEvents(
      "running", 2, 3, [&](const v1::JobEvent& event) { sequences.push_back(event.sequence()); });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(service_.watch_from, 2);
  // The server sent 4 and 5 in the same messages; they are past what was asked for.
  EXPECT_THAT(sequences, ElementsAre(2, 3));
  // The client closed the stream rather than waiting for the server's 20 s.
  EXPECT_TRUE(service_.watch_cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST_F(GrpcCoordinatorClientTest, ReadJobEventsOfAnEndedStreamReportsHowItEnded) {
  std::vector<int64_t> sequences;
  // The stream ends before sequence 9: an ended job has no more events, so that is success.
  EXPECT_TRUE(client_->ReadJobEvents("j-1", 4, 9, [&](const v1::JobEvent& event) {
                       sequences.push_back(event.sequence());
                     }).ok());
  EXPECT_THAT(sequences, ElementsAre(4, 5));
  EXPECT_EQ(client_->ReadJobEvents("broken", 1, 9, [](const v1::JobEvent&) {}),
            absl::UnavailableError("coordinator shutting down"));
  // Nothing to read: no call at all.
  service_.watch_from = -1;
  EXPECT_TRUE(client_->ReadJobEvents("j-1", 5, 4, [](const v1::JobEvent&) {}).ok());
  EXPECT_EQ(service_.watch_from, -1);
}

TEST(GrpcCoordinatorClientCreateTest, RejectsAnEmptyAddress) {
  EXPECT_EQ(GrpcCoordinatorClient::Create({" ", absl::Seconds(1)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GrpcCoordinatorClient::Create({"127.0.0.1:1", absl::ZeroDuration()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GrpcCoordinatorClientCreateTest, UnreachableCoordinatorIsUnavailable) {
  // Port 1 on loopback: nothing listens there, so the connection is refused at once.
  absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> client =
      GrpcCoordinatorClient::Create({"127.0.0.1:1", absl::Seconds(10)});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->ListDevices().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ToAbslStatusTest, MapsCodesOneToOne) {
  EXPECT_TRUE(ToAbslStatus(grpc::Status::OK).ok());
  EXPECT_EQ(ToAbslStatus(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "busy")),
            absl::FailedPreconditionError("busy"));
  EXPECT_EQ(ToAbslStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "full")),
            absl::ResourceExhaustedError("full"));
}

}  // namespace
}  // namespace fitrun::client
