#include "server/bench/bench_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace fitrun::server::bench {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Daemon::Daemon(const std::string& fitrund, const std::string& state_dir, std::vector<std::string> flags)
    : state_dir_(state_dir) {
  std::filesystem::remove(state_dir + "/fitrund.address");  // a killed predecessor's
  std::vector<std::string> args = {fitrund, "--state_dir=" + state_dir, "--metrics_listen=127.0.0.1:0"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string log = state_dir + "/fitrund.log";
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&actions);
}

Daemon::~Daemon() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
}

std::string Daemon::WaitForAddress() {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && pid_ > 0) {
    const std::string address(absl::StripAsciiWhitespace(ReadFile(state_dir_ + "/fitrund.address")));
    if (!address.empty()) return address;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return "";
}

void Daemon::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

bool ListAllJobs(fitrun::v1::Coordinator::Stub& stub, std::vector<fitrun::v1::Job>* jobs, const std::string& token) {
  jobs->clear();
  fitrun::v1::ListJobsRequest request;
  do {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    fitrun::v1::ListJobsResponse page;
    if (!stub.ListJobs(&context, request, &page).ok()) return false;
    jobs->insert(jobs->end(), page.jobs().begin(), page.jobs().end());
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return true;
}

}  // namespace fitrun::server::bench
