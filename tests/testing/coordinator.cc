#include "tests/testing/coordinator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace fitrun::testing {

RunningCoordinator::RunningCoordinator(const std::string& name, const std::string& devices,
                                       std::map<std::string, std::string> extra_env)
    : state_dir_(FreshTestDir(name)),
      devices_(devices),
      extra_env_(std::move(extra_env)),
      log_path_(state_dir_ + "/fitrund.log") {
  Start("127.0.0.1:0");
}

bool RunningCoordinator::Start(const std::string& listen) {
  stub_.reset();
  const std::string address_file = state_dir_ + "/fitrund.address";
  const std::string metrics_file = state_dir_ + "/fitrund.metrics_address";
  std::filesystem::remove(address_file);
  std::filesystem::remove(metrics_file);
  process_ = std::make_unique<Subprocess>(
      std::vector<std::string>{Runfile("server/fitrund"), "--listen=" + listen, "--metrics_listen=127.0.0.1:0",
                               "--state_dir=" + state_dir_, "--devices=" + devices_,
                               "--worker_binary=" + Runfile("worker/fitrun-worker"), "--stop_workers_on_exit",
                               // Where the tests' specs name files: their temporary directory, Debian's datasets.
                               "--data_roots=" + TestTmpDir() + ",/usr/share/datasets"},
      log_path_, extra_env_);
  if (!WaitFor([&] { return !ReadFile(metrics_file).empty() || !process_->Running(); }, absl::Seconds(30))) {
    return false;
  }
  address_ = std::string(absl::StripAsciiWhitespace(ReadFile(address_file)));
  metrics_address_ = std::string(absl::StripAsciiWhitespace(ReadFile(metrics_file)));
  if (address_.empty()) return false;
  auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) return false;
  stub_ = fitrun::v1::Coordinator::NewStub(channel);
  return true;
}

void RunningCoordinator::Kill() {
  if (process_ == nullptr) return;
  process_->Signal(SIGKILL);
  process_->Wait(absl::Seconds(10));
  process_.reset();
  stub_.reset();
}

bool RunningCoordinator::Restart() { return Start(address_); }

RunningCoordinator::~RunningCoordinator() { Stop(); }

void RunningCoordinator::Stop() {
  if (process_ != nullptr) {
    process_->Signal(SIGTERM);
    if (process_->Wait(absl::Seconds(15)) == -1) process_.reset();  // SIGKILLs the group
    process_.reset();
  }
  // Workers have their own process groups; whatever the daemon did not stop dies here.
  WaitFor([&] { return WorkersUnder(state_dir_).empty(); }, absl::Seconds(5));
  KillWorkersUnder(state_dir_);
}

absl::StatusOr<fitrun::v1::Job> RunningCoordinator::Submit(const std::string& spec_yaml, grpc::Status* status) {
  grpc::ClientContext context;
  fitrun::v1::SubmitJobRequest request;
  request.set_spec_yaml(spec_yaml);
  fitrun::v1::SubmitJobResponse response;
  grpc::Status result = stub_->SubmitJob(&context, request, &response);
  if (status != nullptr) *status = result;
  if (!result.ok()) return absl::Status(static_cast<absl::StatusCode>(result.error_code()), result.error_message());
  return response.job();
}

fitrun::v1::Job RunningCoordinator::Get(const std::string& job_id) {
  fitrun::v1::GetJobRequest request;
  request.set_job_id(job_id);
  // A channel can lose its connection between two calls (the next call reconnects); a daemon that is
  // really gone stays UNAVAILABLE, and the failure says so next to its log.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    fitrun::v1::Job job;
    const grpc::Status status = stub_->GetJob(&context, request, &job);
    if (status.ok()) return job;
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() > deadline) {
      std::fprintf(stderr, "GetJob(%s) failed: %d %s\n", job_id.c_str(), static_cast<int>(status.error_code()),
                   status.error_message().c_str());
      return fitrun::v1::Job();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

std::vector<fitrun::v1::JobEvent> RunningCoordinator::Watch(const std::string& job_id, int64_t from_sequence,
                                                            absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  fitrun::v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_from_sequence(from_sequence);
  std::vector<fitrun::v1::JobEvent> events;
  auto reader = stub_->WatchJob(&context, request);
  fitrun::v1::JobEvent event;
  while (reader->Read(&event)) events.push_back(event);
  reader->Finish();
  return events;
}

std::string RunningCoordinator::Metrics() {
  const size_t colon = metrics_address_.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(metrics_address_.substr(colon + 1), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? response : response.substr(body + 4);
}

std::string MlpSpecYaml(const std::string& name, int max_steps, const std::string& extra) {
  return absl::StrCat("name: ", name, "\n",
                      "model: {builtin: mlp}\n"
                      "data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
                      "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}\n"
                      "global_batch_size: 256\n"
                      "max_steps: ", max_steps, "\n",
                      "resources: {min_devices: 2, max_devices: 2}\n"
                      "ddp: {collective_timeout_seconds: 60}\n"
                      "seed: 7\n",
                      extra);
}

}  // namespace fitrun::testing
