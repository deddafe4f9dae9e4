// The HTTP side against a real JobManager (fake store, launcher and devices) on 127.0.0.1: /metrics
// with the live device and job series, the page, the JSON API, and an event stream that replays a
// job's history, follows it live, resumes after Last-Event-ID and ends with the job. Then the same
// server secured by a real Authenticator over a token file: 401s naming what to send, each user's
// own jobs only (another's is a 404 like a missing one), sign-in to a session cookie that the API
// and the event stream take, sign-out, cross-site requests refused, and /metrics for users only
// unless public.
#include "server/web/web_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/auth/authenticator.h"
#include "server/core/testing/fake_device_inventory.h"
#include "server/core/testing/fake_job_store.h"
#include "server/core/testing/fake_worker_launcher.h"
#include "server/core/testing/recording_metrics.h"
#include "server/core/jobs/job_manager.h"
#include "server/core/jobs/job_manager_testing.h"
#include "server/metrics/live_metrics.h"
#include "server/metrics/prometheus_metrics.h"

namespace fitrun::server {
namespace {

// An HTTP/1.1 request (a GET unless `method` says otherwise) on a fresh connection; ReadUntil()
// collects the response as it arrives.
class HttpGet {
 public:
  HttpGet(const std::string& address, const std::string& path, const std::string& extra_headers = "",
          const std::string& method = "GET", const std::string& body = "") {
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
        absl::StrCat(method, " ", path, " HTTP/1.1\r\n",
                     absl::StrContains(extra_headers, "Host:") ? "" : "Host: localhost\r\n", extra_headers,
                     body.empty() && method == "GET" ? "" : absl::StrCat("Content-Length: ", body.size(), "\r\n"),
                     "Connection: close\r\n\r\n", body);
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

std::string Get(const std::string& address, const std::string& path, const std::string& extra_headers = "") {
  HttpGet get(address, path, extra_headers);
  EXPECT_TRUE(get.ReadUntil(""));
  return get.received();
}

std::string Send(const std::string& address, const std::string& method, const std::string& path,
                 const std::string& extra_headers, const std::string& body = "") {
  HttpGet request(address, path, extra_headers, method, body);
  EXPECT_TRUE(request.ReadUntil(""));
  return request.received();
}

std::string Bearer(const std::string& token) { return absl::StrCat("Authorization: Bearer ", token, "\r\n"); }

// The body of a response, after its head.
std::string BodyOf(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

// The value of the response's first `name:` header, or "".
std::string HeaderOf(const std::string& response, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(response.substr(0, response.find("\r\n\r\n")), "\r\n")) {
    if (absl::StartsWithIgnoreCase(line, name + ":")) return std::string(absl::StripAsciiWhitespace(line.substr(name.size() + 1)));
  }
  return "";
}

class WebServerTest : public ::testing::Test {
 protected:
  // What a secured variant changes: the web server's options, and who submits the first job.
  virtual void Configure(WebServer::Options* web) {}
  virtual std::string FirstJobOwner() { return ""; }

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
    Configure(&web);
    auto server = WebServer::Start(web, manager_.get(), {registry_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);

    absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(MlpSpec("web-test", 64, 1000, 1, 1), FirstJobOwner());
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

TEST_F(WebServerTest, ARequestForAHostNameThisServerDoesNotGoByIsRefused) {
  const std::string port = server_->address().substr(server_->address().rfind(':') + 1);
  // A page that rebound its own name to 127.0.0.1 asks for its name: the local admin's API stays shut.
  for (const std::string& host : std::vector<std::string>{"rebound.example", absl::StrCat("rebound.example:", port)}) {
    const std::string refused = Get(server_->address(), "/api/jobs", absl::StrCat("Host: ", host, "\r\n"));
    EXPECT_TRUE(absl::StartsWith(refused, "HTTP/1.1 421")) << refused;
    EXPECT_FALSE(absl::StrContains(refused, job_id_));
    EXPECT_TRUE(absl::StartsWith(
        Send(server_->address(), "DELETE", "/api/session", absl::StrCat("Host: ", host, "\r\n")), "HTTP/1.1 421"));
  }
  for (const std::string& host : std::vector<std::string>{absl::StrCat("127.0.0.1:", port), "localhost", absl::StrCat("[::1]:", port),
                                 "LOCALHOST:1"}) {
    const std::string answered = Get(server_->address(), "/api/jobs", absl::StrCat("Host: ", host, "\r\n"));
    EXPECT_TRUE(absl::StartsWith(answered, "HTTP/1.1 200")) << host << ": " << answered;
  }
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

TEST_F(WebServerTest, HttpsWithACertificateItCannotUseDoesNotStartAndNamesTheFlag) {
  // The TLS context is made at start, so a bad file stops fitrund at once, not at the first request.
  WebServer::Options web;
  web.listen = "127.0.0.1:0";
  web.tls = WebTls{dir_ + "/missing.pem", dir_ + "/missing.key", ""};
  auto server = WebServer::Start(web, manager_.get(), {registry_});
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::StrContains(server.status().message(), "--tls_cert: cannot use " + dir_ + "/missing.pem"))
      << server.status();
  EXPECT_TRUE(absl::StrContains(server.status().message(), "--metrics_listen")) << server.status();
}

TEST_F(WebServerTest, LocalModeIsTheLocalAdminAndNeedsNoSignIn) {
  const std::string me = Get(server_->address(), "/api/session");
  EXPECT_TRUE(absl::StartsWith(me, "HTTP/1.1 200")) << me;
  EXPECT_EQ(BodyOf(me), "{\"user\":\"local\",\"admin\":true,\"secured\":false}");
  const std::string signed_in =
      Send(server_->address(), "POST", "/api/session", "Content-Type: application/json\r\n", "{\"token\":\"x\"}");
  EXPECT_TRUE(absl::StartsWith(signed_in, "HTTP/1.1 200")) << signed_in;
  EXPECT_EQ(HeaderOf(signed_in, "Set-Cookie"), "") << "local mode needs no session";
  // A token sent anyway changes nothing: there are no users to tell apart.
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/api/jobs", Bearer("anything")), "HTTP/1.1 200"));
}

// The same server behind users: alice and bob (users) and root (an admin). The first job is bob's;
// each test may submit alice's.
class SecuredWebServerTest : public WebServerTest {
 protected:
  void Configure(WebServer::Options* web) override {
    const std::string path = absl::StrCat(::testing::TempDir(), "/web-tokens-", getpid());
    std::ofstream(path) << "alice user " << Authenticator::Sha256Hex("alice-token") << "\n"
                        << "bob user " << Authenticator::Sha256Hex("bob-token") << "\n"
                        << "root admin " << Authenticator::Sha256Hex("root-token") << "\n";
    auto authenticator = Authenticator::Create({path, false});
    ASSERT_TRUE(authenticator.ok()) << authenticator.status();
    authenticator_ = *std::move(authenticator);
    web->authenticator = authenticator_.get();
    web->metrics_public = metrics_public_;
    web->max_event_streams_per_user = 2;
  }
  std::string FirstJobOwner() override { return "bob"; }

  // alice's job, running on the other device.
  std::string SubmitAlicesJob() {
    absl::StatusOr<fitrun::v1::Job> job = manager_->Submit(MlpSpec("alices", 64, 1000, 1, 1), "alice");
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(launcher_.WaitForLaunches(2, absl::Seconds(10)));
    WaitForState(*manager_, job->id(), fitrun::v1::JOB_STATE_RUNNING);
    return job->id();
  }

  // Signs in with `token`; the Cookie header line the browser would send from then on.
  std::string SignIn(const std::string& token) {
    const std::string reply = Send(server_->address(), "POST", "/api/session", "Content-Type: application/json\r\n",
                                   absl::StrCat("{\"token\": \"", token, "\"}"));
    EXPECT_TRUE(absl::StartsWith(reply, "HTTP/1.1 200")) << reply;
    const std::string set_cookie = HeaderOf(reply, "Set-Cookie");
    return absl::StrCat("Cookie: ", set_cookie.substr(0, set_cookie.find(';')), "\r\n");
  }

  // Bob's job is not there for `caller`: the same 404 as a job that does not exist.
  void ExpectNoSuchJob(const std::string& headers, const std::string& job_id) {
    const std::string missing = Get(server_->address(), "/api/jobs/j-nope", headers);
    const std::string hidden = Get(server_->address(), absl::StrCat("/api/jobs/", job_id), headers);
    EXPECT_TRUE(absl::StartsWith(hidden, "HTTP/1.1 404")) << hidden;
    EXPECT_EQ(BodyOf(hidden), absl::StrCat("{\"error\":\"job_id: no job '", job_id, "'\"}"));
    EXPECT_EQ(BodyOf(missing), "{\"error\":\"job_id: no job 'j-nope'\"}");
    const std::string events = Get(server_->address(), absl::StrCat("/api/jobs/", job_id, "/events"), headers);
    EXPECT_TRUE(absl::StartsWith(events, "HTTP/1.1 404")) << events;
  }

  bool metrics_public_ = false;
  std::unique_ptr<Authenticator> authenticator_;
};

TEST_F(SecuredWebServerTest, WithoutACredentialTheApiSaysWhatToSendAndThePageIsTheSignIn) {
  for (const std::string& path : std::vector<std::string>{"/api/jobs", "/api/devices", "/api/session",
                                                          absl::StrCat("/api/jobs/", job_id_),
                                                          absl::StrCat("/api/jobs/", job_id_, "/events")}) {
    for (const std::string& headers : std::vector<std::string>{"", Bearer("guess")}) {
      const std::string reply = Get(server_->address(), path, headers);
      EXPECT_TRUE(absl::StartsWith(reply, "HTTP/1.1 401")) << path << ": " << reply;
      EXPECT_EQ(HeaderOf(reply, "WWW-Authenticate"), "Bearer realm=\"fitrund\"") << path;
      EXPECT_FALSE(absl::StrContains(reply, job_id_)) << path;
    }
  }
  EXPECT_TRUE(absl::StrContains(Get(server_->address(), "/api/jobs"), "Authorization: Bearer <token>"));
  const std::string page = Get(server_->address(), "/");
  EXPECT_TRUE(absl::StartsWith(page, "HTTP/1.1 200")) << page.substr(0, 200);
  EXPECT_TRUE(absl::StrContains(page, "Sign in to fitrund"));
  EXPECT_FALSE(absl::StrContains(page, "window.fitrunPage")) << "the jobs page went to a stranger";
  EXPECT_FALSE(absl::StrContains(page, "src=\"http")) << "the sign-in page loads something from elsewhere";
  EXPECT_TRUE(absl::StrContains(page, "frame-ancestors 'none'"));
  // With a token, the jobs page.
  EXPECT_TRUE(absl::StrContains(Get(server_->address(), "/", Bearer("alice-token")), "window.fitrunPage"));
}

TEST_F(SecuredWebServerTest, EachUserSeesTheirOwnJobsAndAnAdminEveryJob) {
  const std::string bobs = job_id_;
  const std::string alices = SubmitAlicesJob();
  const std::string alice = Bearer("alice-token");
  const std::string jobs = Get(server_->address(), "/api/jobs", alice);
  EXPECT_TRUE(absl::StartsWith(jobs, "HTTP/1.1 200")) << jobs;
  EXPECT_TRUE(absl::StrContains(jobs, absl::StrCat("\"id\":\"", alices, "\"")));
  EXPECT_FALSE(absl::StrContains(jobs, bobs)) << jobs;
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), absl::StrCat("/api/jobs/", alices), alice), "HTTP/1.1 200"));
  ExpectNoSuchJob(alice, bobs);

  const std::string all = Get(server_->address(), "/api/jobs", Bearer("root-token"));
  EXPECT_TRUE(absl::StrContains(all, alices));
  EXPECT_TRUE(absl::StrContains(all, bobs));
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), absl::StrCat("/api/jobs/", bobs), Bearer("root-token")),
                               "HTTP/1.1 200"));
  const std::string me = Get(server_->address(), "/api/session", Bearer("root-token"));
  EXPECT_EQ(BodyOf(me), "{\"user\":\"root\",\"admin\":true,\"secured\":true}");

  // Devices: both shown to alice, with the job holding each only where it is hers.
  const std::string devices = Get(server_->address(), "/api/devices", alice);
  EXPECT_TRUE(absl::StrContains(devices, "\"id\":\"cpu:0\""));
  EXPECT_TRUE(absl::StrContains(devices, "\"id\":\"cpu:1\""));
  EXPECT_TRUE(absl::StrContains(devices, absl::StrCat("\"job_id\":\"", alices, "\"")));
  EXPECT_FALSE(absl::StrContains(devices, bobs)) << devices;
  EXPECT_TRUE(absl::StrContains(devices, "\"held_by_another_user\":true")) << devices;
  const std::string every = Get(server_->address(), "/api/devices", Bearer("root-token"));
  EXPECT_TRUE(absl::StrContains(every, bobs));
  EXPECT_FALSE(absl::StrContains(every, "\"held_by_another_user\":true"));
}

TEST_F(SecuredWebServerTest, SigningInGivesACookieForTheApiThePageAndTheEventStream) {
  const std::string alices = SubmitAlicesJob();
  const std::string reply = Send(server_->address(), "POST", "/api/session", "Content-Type: application/json\r\n",
                                 "{\"token\":\"alice-token\"}");
  EXPECT_TRUE(absl::StartsWith(reply, "HTTP/1.1 200")) << reply;
  EXPECT_TRUE(absl::StrContains(BodyOf(reply), "\"user\":\"alice\",\"admin\":false,\"expires_at\":\""));
  const std::string set_cookie = HeaderOf(reply, "Set-Cookie");
  EXPECT_TRUE(absl::StartsWith(set_cookie, "fitrun_session=")) << set_cookie;
  EXPECT_TRUE(absl::StrContains(set_cookie, "; HttpOnly"));
  EXPECT_TRUE(absl::StrContains(set_cookie, "; SameSite=Strict"));
  EXPECT_TRUE(absl::StrContains(set_cookie, "; Path=/"));
  EXPECT_FALSE(absl::StrContains(set_cookie, "Secure")) << "plain HTTP: a Secure cookie would never come back";
  const std::string cookie = absl::StrCat("Cookie: ", set_cookie.substr(0, set_cookie.find(';')), "\r\n");

  const std::string jobs = Get(server_->address(), "/api/jobs", cookie);
  EXPECT_TRUE(absl::StartsWith(jobs, "HTTP/1.1 200")) << jobs;
  EXPECT_TRUE(absl::StrContains(jobs, alices));
  EXPECT_FALSE(absl::StrContains(jobs, job_id_));
  EXPECT_TRUE(absl::StrContains(Get(server_->address(), "/", cookie), "window.fitrunPage"));
  EXPECT_EQ(BodyOf(Get(server_->address(), "/api/session", cookie)),
            "{\"user\":\"alice\",\"admin\":false,\"secured\":true}");
  ExpectNoSuchJob(cookie, job_id_);

  // The event stream (an EventSource sends no headers of its own: the cookie is its credential).
  HttpGet stream(server_->address(), absl::StrCat("/api/jobs/", alices, "/events?from=1"), cookie);
  ASSERT_TRUE(stream.ReadUntil("text/event-stream")) << stream.received();
  ASSERT_TRUE(stream.ReadUntil("id: 1\nevent: job_event\n")) << stream.received();

  // Signing out ends the session, and with it the open stream at its next wake-up.
  const std::string out = Send(server_->address(), "POST", "/api/logout", cookie);
  EXPECT_TRUE(absl::StartsWith(out, "HTTP/1.1 200")) << out;
  EXPECT_TRUE(absl::StartsWith(HeaderOf(out, "Set-Cookie"), "fitrun_session=; Path=/; Max-Age=0"));
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/api/jobs", cookie), "HTTP/1.1 401"));
  EXPECT_TRUE(absl::StrContains(Get(server_->address(), "/api/jobs", cookie), "sign in again"));
  EXPECT_TRUE(absl::StrContains(Get(server_->address(), "/", cookie), "Sign in to fitrund"));
  ASSERT_TRUE(stream.ReadUntil("event: error")) << stream.received();
  EXPECT_TRUE(stream.ReadUntil("")) << "the stream stays open after its session ended";
}

TEST_F(SecuredWebServerTest, SignInTakesAFormOrABearerHeaderAndRefusesAnythingElse) {
  const std::string form = Send(server_->address(), "POST", "/api/session",
                                "Content-Type: application/x-www-form-urlencoded\r\n", "token=bob-token");
  EXPECT_TRUE(absl::StartsWith(form, "HTTP/1.1 200")) << form;
  EXPECT_TRUE(absl::StrContains(BodyOf(form), "\"user\":\"bob\""));
  const std::string header = Send(server_->address(), "POST", "/api/session", Bearer("root-token"));
  EXPECT_TRUE(absl::StartsWith(header, "HTTP/1.1 200")) << header;
  EXPECT_TRUE(absl::StrContains(BodyOf(header), "\"user\":\"root\",\"admin\":true"));

  // A wrong token: 401, no cookie, and the same words whichever way it was wrong.
  const std::string wrong = Send(server_->address(), "POST", "/api/session", "Content-Type: application/json\r\n",
                                 "{\"token\":\"alice-tokeN\"}");
  const std::string unknown = Send(server_->address(), "POST", "/api/session",
                                   "Content-Type: application/x-www-form-urlencoded\r\n", "token=nobody");
  EXPECT_TRUE(absl::StartsWith(wrong, "HTTP/1.1 401")) << wrong;
  EXPECT_EQ(HeaderOf(wrong, "Set-Cookie"), "");
  EXPECT_EQ(BodyOf(wrong), BodyOf(unknown));
  EXPECT_TRUE(absl::StartsWith(Send(server_->address(), "POST", "/api/session", "", ""), "HTTP/1.1 400"));
  EXPECT_TRUE(absl::StartsWith(Send(server_->address(), "POST", "/api/session", "Content-Type: application/json\r\n",
                                    std::string(9000, 'x')),
                               "HTTP/1.1 413"));
  // Another site's page cannot sign a browser in or out.
  const std::string cross = Send(server_->address(), "POST", "/api/session",
                                 "Content-Type: application/json\r\nOrigin: http://evil.example\r\n",
                                 "{\"token\":\"alice-token\"}");
  EXPECT_TRUE(absl::StartsWith(cross, "HTTP/1.1 403")) << cross;
  EXPECT_EQ(HeaderOf(cross, "Set-Cookie"), "");
  const std::string same = Send(server_->address(), "POST", "/api/session",
                                "Content-Type: application/json\r\nOrigin: http://localhost\r\n",
                                "{\"token\":\"alice-token\"}");
  EXPECT_TRUE(absl::StartsWith(same, "HTTP/1.1 200")) << same;
  // Behind a TLS-terminating proxy the page's origin is https://, and the cookie is Secure.
  const std::string proxied = Send(server_->address(), "POST", "/api/session",
                                   "Content-Type: application/json\r\nOrigin: https://localhost\r\n"
                                   "X-Forwarded-Proto: https\r\n",
                                   "{\"token\":\"alice-token\"}");
  EXPECT_TRUE(absl::StartsWith(proxied, "HTTP/1.1 200")) << proxied;
  EXPECT_TRUE(absl::EndsWith(HeaderOf(proxied, "Set-Cookie"), "; HttpOnly; SameSite=Strict; Secure")) << proxied;
  // DELETE /api/session signs out too.
  const std::string cookie = SignIn("alice-token");
  EXPECT_TRUE(absl::StartsWith(Send(server_->address(), "DELETE", "/api/session", cookie), "HTTP/1.1 200"));
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/api/jobs", cookie), "HTTP/1.1 401"));
}

TEST_F(SecuredWebServerTest, EachUserSeesTheSeriesOfTheirOwnJobsAndAnAdminEveryJobs) {
  const std::string alices = SubmitAlicesJob();
  const std::string alice_sees = Get(server_->address(), "/metrics", Bearer("alice-token"));
  EXPECT_TRUE(absl::StrContains(alice_sees, absl::StrCat("fitrun_job_info{job_id=\"", alices, "\"")));
  EXPECT_FALSE(absl::StrContains(alice_sees, job_id_)) << "bob's job, in no label of alice's scrape";
  EXPECT_TRUE(absl::StrContains(alice_sees, "fitrun_device_memory_total_bytes{device=\"cpu:0\"}"));
  const std::string root_sees = Get(server_->address(), "/metrics", Bearer("root-token"));
  EXPECT_TRUE(absl::StrContains(root_sees, alices));
  EXPECT_TRUE(absl::StrContains(root_sees, job_id_));
}

TEST_F(SecuredWebServerTest, OneUserTakesAtMostTheirShareOfEventStreams) {
  const std::string alices = SubmitAlicesJob();
  HttpGet first(server_->address(), absl::StrCat("/api/jobs/", alices, "/events"), Bearer("alice-token"));
  HttpGet second(server_->address(), absl::StrCat("/api/jobs/", alices, "/events"), Bearer("alice-token"));
  ASSERT_TRUE(first.ReadUntil("text/event-stream"));
  ASSERT_TRUE(second.ReadUntil("text/event-stream"));
  const std::string third = Get(server_->address(), absl::StrCat("/api/jobs/", alices, "/events"), Bearer("alice-token"));
  EXPECT_TRUE(absl::StartsWith(third, "HTTP/1.1 429")) << third;
  EXPECT_TRUE(absl::StrContains(third, "alice has 2 event streams open"));
  HttpGet bobs(server_->address(), absl::StrCat("/api/jobs/", job_id_, "/events"), Bearer("bob-token"));
  EXPECT_TRUE(bobs.ReadUntil("text/event-stream")) << "bob's stream opens beside alice's";
}

TEST_F(SecuredWebServerTest, MetricsNeedAUsersCredential) {
  const std::string anonymous = Get(server_->address(), "/metrics");
  EXPECT_TRUE(absl::StartsWith(anonymous, "HTTP/1.1 401")) << anonymous;
  EXPECT_TRUE(absl::StrContains(anonymous, "credentials_file"));
  EXPECT_FALSE(absl::StrContains(anonymous, "fitrun_build_info"));
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/metrics", Bearer("guess")), "HTTP/1.1 401"));
  const std::string scraped = Get(server_->address(), "/metrics", Bearer("bob-token"));
  EXPECT_TRUE(absl::StartsWith(scraped, "HTTP/1.1 200")) << scraped;
  EXPECT_TRUE(absl::StrContains(scraped, "fitrun_build_info{version=\"v1\"} 1"));
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/metrics", SignIn("alice-token")), "HTTP/1.1 200"));
}

class PublicMetricsWebServerTest : public SecuredWebServerTest {
 protected:
  void Configure(WebServer::Options* web) override {
    metrics_public_ = true;
    SecuredWebServerTest::Configure(web);
  }
};

TEST_F(PublicMetricsWebServerTest, MetricsAreOpenAndTheApiIsNot) {
  const std::string scraped = Get(server_->address(), "/metrics");
  EXPECT_TRUE(absl::StartsWith(scraped, "HTTP/1.1 200")) << scraped;
  EXPECT_TRUE(absl::StrContains(scraped, "fitrun_build_info"));
  EXPECT_FALSE(absl::StrContains(scraped, job_id_)) << "an anonymous scrape names no job";
  EXPECT_TRUE(absl::StartsWith(Get(server_->address(), "/api/jobs"), "HTTP/1.1 401"));
  EXPECT_TRUE(absl::StrContains(Get(server_->address(), "/"), "Sign in to fitrund"));
}

}  // namespace
}  // namespace fitrun::server
