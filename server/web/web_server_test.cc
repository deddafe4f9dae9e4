// The HTTP side against a real JobManager (fake store, launcher and devices) on 127.0.0.1: /metrics
// with the live device and job series, the page, the JSON API, and an event stream that replays a
// job's history, follows it live, resumes after Last-Event-ID and ends with the job.
#include "server/web/web_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/fakes.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"
#include "server/metrics/live_metrics.h"
#include "server/metrics/prometheus_metrics.h"

namespace fitrun::server {
namespace {

// An HTTP/1.1 GET on a fresh connection; Read() collects the response as it arrives.
class HttpGet {
 public:
  HttpGet(const std::string& address, const std::string& path, const std::string& extra_headers = "") {
    const size_t colon = address.rfind(':');
    int port = 0;
    EXPECT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port));
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in peer{};
    peer.sin_family = AF_INET;
    peer.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &peer.sin_addr);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)), 0);
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\n", extra_headers, "Connection: close\r\n\r\n");
    EXPECT_EQ(write(fd_, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  }
  ~HttpGet() { close(fd_); }

  // Reads until `want` has arrived (or, with want empty, until the server closes), at most `timeout`.
  bool ReadUntil(const std::string& want, absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (want.empty() || !absl::StrContains(received_, want)) {
      if (closed_) return want.empty();
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (left <= 0 || poll(&p, 1, left) <= 0) return false;
      char buffer[4096];
      const ssize_t n = read(fd_, buffer, sizeof(buffer));
      if (n <= 0) {
        closed_ = true;
        continue;
      }
      received_.append(buffer, static_cast<size_t>(n));
    }
    return true;
  }
  const std::string& received() const { return received_; }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  std::string received_;
  bool closed_ = false;
};

std::string Get(const std::string& address, const std::string& path) {
  HttpGet get(address, path);
  EXPECT_TRUE(get.ReadUntil(""));
  return get.received();
}

class WebServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/web-server-", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    JobManager::Options options;
    options.state_dir = dir_;
    options.worker_binary = "/bin/true";
    auto manager = JobManager::Create(options, &store_, &devices_, &launcher_, &metrics_);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
    registry_ = std::make_shared<prometheus::Registry>();
    prometheus_metrics_ = std::make_unique<PrometheusMetrics>(*registry_, "v1", absl::Now());
    WebServer::Options web;
    web.listen = "127.0.0.1:0";
    web.keepalive = absl::Milliseconds(200);
    auto server = WebServer::Start(web, manager_.get(), {registry_, std::make_shared<LiveMetrics>(manager_.get())});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);

    absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(MlpSpec("web-test", 64, 1000, 1, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->id();
    ASSERT_TRUE(launcher_.WaitForLaunches(1, absl::Seconds(10)));
    WaitForState(*manager_, job_id_, fitrun::v1::JOB_STATE_RUNNING);
  }

  void TearDown() override {
    server_.reset();
    if (manager_ != nullptr) manager_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  void ReportProgress(int64_t step, double loss, int64_t peak_bytes) {
    fitrun::v1::WorkerReport report;
    report.mutable_progress()->set_step(step);
    report.mutable_progress()->set_total_steps(1000);
    report.mutable_progress()->set_loss(loss);
    report.mutable_progress()->set_samples_per_second(640);
    report.mutable_progress()->set_step_seconds(0.1);
    report.mutable_progress()->set_exposed_communication_share(0.25);
    report.mutable_progress()->set_peak_bytes(peak_bytes);
    manager_->OnWorkerReport(WorkerKey{job_id_, 1, 0}, report);
  }

  void FinishJob() {
    fitrun::v1::WorkerReport finished;
    finished.mutable_finished()->set_steps(1000);
    manager_->OnWorkerReport(WorkerKey{job_id_, 1, 0}, finished);
    launcher_.Exit(0, 0);
    WaitForState(*manager_, job_id_, fitrun::v1::JOB_STATE_SUCCEEDED);
  }

  std::string dir_;
  FakeJobStore store_;
  FakeDeviceInventory devices_{2, 1 << 30};
  FakeWorkerLauncher launcher_;
  RecordingMetrics metrics_;
  std::unique_ptr<JobManager> manager_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<PrometheusMetrics> prometheus_metrics_;
  std::unique_ptr<WebServer> server_;
  std::string job_id_;
};

TEST_F(WebServerTest, MetricsShowTheDevicesAndTheRunningJobThenDropTheJobWhenItEnds) {
  ReportProgress(5, 1.25, 7 << 20);
  const std::string running = Get(server_->address(), "/metrics");
  EXPECT_TRUE(absl::StartsWith(running, "HTTP/1.1 200")) << running;
  EXPECT_TRUE(absl::StrContains(running, "text/plain; version=0.0.4"));
  EXPECT_TRUE(absl::StrContains(running, "fitrun_build_info{version=\"v1\"} 1"));
  EXPECT_TRUE(absl::StrContains(running, "fitrun_jobs{state=\"running\"}"));
  EXPECT_TRUE(absl::StrContains(running, "fitrun_device_memory_total_bytes{device=\"cpu:0\"} 1073741824"));
  EXPECT_TRUE(absl::StrContains(running, "fitrun_device_memory_total_bytes{device=\"cpu:1\"} 1073741824"));
  EXPECT_TRUE(absl::StrContains(running, "fitrun_device_memory_peak_bytes{device=\"cpu:0\"} 7340032")) << running;
  EXPECT_TRUE(absl::StrContains(running, "fitrun_device_memory_peak_bytes{device=\"cpu:1\"} 0"));
  EXPECT_TRUE(absl::StrContains(running, absl::StrCat("fitrun_device_job_info{device=\"cpu:0\",job_id=\"", job_id_,
                                                      "\",rank=\"0\"} 1")));
  const std::string job = absl::StrCat("{job_id=\"", job_id_, "\"}");
  EXPECT_TRUE(absl::StrContains(running, absl::StrCat("fitrun_job_loss", job, " 1.25")));
  EXPECT_TRUE(absl::StrContains(running, absl::StrCat("fitrun_job_step", job, " 5")));
  EXPECT_TRUE(absl::StrContains(running, absl::StrCat("fitrun_job_total_steps", job, " 1000")));
  EXPECT_TRUE(absl::StrContains(running, absl::StrCat("fitrun_job_samples_per_second", job, " 640")));
  EXPECT_TRUE(absl::StrContains(running, absl::StrCat("fitrun_job_exposed_communication_ratio", job, " 0.25")));
  EXPECT_TRUE(absl::StrContains(running, absl::StrCat("fitrun_job_per_device_batch", job, " 64")));

  FinishJob();
  const std::string ended = Get(server_->address(), "/metrics");
  EXPECT_FALSE(absl::StrContains(ended, job_id_)) << "per-job series outlive the job";
  EXPECT_TRUE(absl::StrContains(ended, "fitrun_device_memory_peak_bytes{device=\"cpu:0\"} 0"));
}

TEST_F(WebServerTest, ServesThePageWithNothingFromElsewhere) {
  const std::string page = Get(server_->address(), "/");
  EXPECT_TRUE(absl::StartsWith(page, "HTTP/1.1 200")) << page.substr(0, 200);
  EXPECT_TRUE(absl::StrContains(page, "text/html"));
  EXPECT_TRUE(absl::StrContains(page, "</html>"));
  EXPECT_TRUE(absl::StrContains(page, "Content-Security-Policy: default-src 'none'"));
  EXPECT_FALSE(absl::StrContains(page, "src=\"http")) << "the page loads something from elsewhere";
  EXPECT_FALSE(absl::StrContains(page, "href=\"http")) << "the page loads something from elsewhere";
}

TEST_F(WebServerTest, ApiListsJobsAndDevicesAndShowsAJobWithItsRanks) {
  ReportProgress(3, 2.5, 5 << 20);
  const std::string jobs = Get(server_->address(), "/api/jobs");
  EXPECT_TRUE(absl::StrContains(jobs, "application/json"));
  EXPECT_TRUE(absl::StrContains(jobs, absl::StrCat("\"id\":\"", job_id_, "\"")));
  EXPECT_TRUE(absl::StrContains(jobs, "\"state\":\"JOB_STATE_RUNNING\""));
  EXPECT_TRUE(absl::StrContains(jobs, "\"name\":\"web-test\""));

  const std::string devices = Get(server_->address(), "/api/devices");
  EXPECT_TRUE(absl::StrContains(devices, "\"id\":\"cpu:0\""));
  EXPECT_TRUE(absl::StrContains(devices, "\"peak_bytes\":\"5242880\""));

  const std::string one = Get(server_->address(), absl::StrCat("/api/jobs/", job_id_));
  EXPECT_TRUE(absl::StartsWith(one, "HTTP/1.1 200"));
  EXPECT_TRUE(absl::StrContains(one, "\"ranks\":[{\"rank\":0,\"device_id\":\"cpu:0\""));
  EXPECT_TRUE(absl::StrContains(one, "\"peak_bytes\":\"5242880\",\"cap_bytes\":\"1073741824\""));
  EXPECT_TRUE(absl::StrContains(one, "\"attempt_history\""));

  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/api/jobs/no-such-job"), "HTTP/1.1 404"));
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/no/such/page"), "HTTP/1.1 404"));
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), absl::StrCat("/api/jobs/", job_id_, "/events?from=x")),
                               "HTTP/1.1 400"));
}

TEST_F(WebServerTest, EventStreamReplaysHistoryFollowsLiveAndEndsWithTheJob) {
  ReportProgress(1, 3.0, 1 << 20);
  HttpGet stream(server_->address(), absl::StrCat("/api/jobs/", job_id_, "/events?from=1"));
  ASSERT_TRUE(stream.ReadUntil("text/event-stream"));
  ASSERT_TRUE(stream.ReadUntil("id: 1\nevent: job_event\ndata: {")) << stream.received();
  ASSERT_TRUE(stream.ReadUntil("\"step\":\"1\"")) << stream.received();
  // A report made while the stream waits arrives on it.
  ReportProgress(42, 0.5, 1 << 20);
  ASSERT_TRUE(stream.ReadUntil("\"step\":\"42\"")) << stream.received();
  // An idle stream keeps the connection alive.
  ASSERT_TRUE(stream.ReadUntil(": keepalive"));
  FinishJob();
  ASSERT_TRUE(stream.ReadUntil("JOB_STATE_SUCCEEDED"));
  ASSERT_TRUE(stream.ReadUntil("event: end\ndata: {}\n\n"));
  EXPECT_TRUE(stream.ReadUntil("")) << "the stream stays open after the end";
}

TEST_F(WebServerTest, EventStreamResumesAfterLastEventId) {
  ReportProgress(1, 3.0, 1 << 20);
  FinishJob();
  HttpGet stream(server_->address(), absl::StrCat("/api/jobs/", job_id_, "/events"), "Last-Event-ID: 2\r\n");
  ASSERT_TRUE(stream.ReadUntil("event: end"));
  const std::string& text = stream.received();
  EXPECT_FALSE(absl::StrContains(text, "id: 1\n"));
  EXPECT_FALSE(absl::StrContains(text, "id: 2\n"));
  EXPECT_TRUE(absl::StrContains(text, "id: 3\n")) << text;
}

TEST_F(WebServerTest, ServerStopsWithAStreamOpen) {
  HttpGet stream(server_->address(), absl::StrCat("/api/jobs/", job_id_, "/events"));
  ASSERT_TRUE(stream.ReadUntil("id: 1\n"));
  server_.reset();  // must not wait for the job to end
  EXPECT_TRUE(stream.ReadUntil(""));
}

}  // namespace
}  // namespace fitrun::server
