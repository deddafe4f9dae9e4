// A real fitrund for a test: started on OS-chosen ports with its own state directory, reached over
// real gRPC. Stopping it (or destroying the object) stops the daemon and kills any worker of this
// coordinator that is still alive, so no test leaves a process behind.
#ifndef FITRUN_TESTS_TESTING_COORDINATOR_H_
#define FITRUN_TESTS_TESTING_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/coordinator.grpc.pb.h"
#include "tests/testing/processes.h"

namespace fitrun::testing {

class RunningCoordinator {
 public:
  // Starts fitrund with `--devices=<devices>` (and `extra_env` in its environment, which its workers
  // inherit) and waits until it serves. Check ok() before use.
  RunningCoordinator(const std::string& name, const std::string& devices,
                     std::map<std::string, std::string> extra_env = {});
  ~RunningCoordinator();

  // SIGKILLs the daemon alone: its workers (in their own process groups) keep running.
  void Kill();
  // Starts a new daemon on the same address and state directory, as a restart after a crash.
  bool Restart();

  bool ok() const { return stub_ != nullptr; }
  const std::string& address() const { return address_; }
  const std::string& state_dir() const { return state_dir_; }
  const std::string& log_path() const { return log_path_; }
  fitrun::v1::Coordinator::Stub& stub() { return *stub_; }

  absl::StatusOr<fitrun::v1::Job> Submit(const std::string& spec_yaml, grpc::Status* status = nullptr);
  fitrun::v1::Job Get(const std::string& job_id);
  // Every event of the job from `from_sequence` until the job ends (or `timeout`).
  std::vector<fitrun::v1::JobEvent> Watch(const std::string& job_id, int64_t from_sequence = 1,
                                          absl::Duration timeout = absl::Seconds(300));
  // The body of GET /metrics.
  std::string Metrics();
  // SIGTERM, wait, then make sure no worker of this coordinator survives.
  void Stop();

 private:
  bool Start(const std::string& listen);

  std::string state_dir_;
  std::string devices_;
  std::map<std::string, std::string> extra_env_;
  std::string log_path_;
  std::string address_;
  std::string metrics_address_;
  std::unique_ptr<Subprocess> process_;
  std::unique_ptr<fitrun::v1::Coordinator::Stub> stub_;
};

// A job spec for the built-in MLP on Fashion-MNIST, training for `max_steps`, with `extra` YAML
// lines appended (e.g. fault injection).
std::string MlpSpecYaml(const std::string& name, int max_steps, const std::string& extra = "");

}  // namespace fitrun::testing

#endif  // FITRUN_TESTS_TESTING_COORDINATOR_H_
