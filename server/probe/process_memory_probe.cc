#include "server/probe/process_memory_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "fitrun/v1/worker.pb.h"
#include "google/protobuf/text_format.h"
#include "server/core/model_profile.h"
#include "server/launcher/child_spawn.h"

extern char** environ;

namespace fitrun::server {
namespace {

// The integer after "name": in the probe's flat JSON line.
bool JsonInt(absl::string_view json, absl::string_view name, int64_t* value) {
  const std::string quoted = absl::StrCat("\"", name, "\":");
  const size_t at = json.find(quoted);
  if (at == absl::string_view::npos) return false;
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(json.substr(at + quoted.size()));
  size_t end = 0;
  while (end < rest.size() && (rest[end] == '-' || (rest[end] >= '0' && rest[end] <= '9'))) ++end;
  return absl::SimpleAtoi(rest.substr(0, end), value);
}

// The last `limit` bytes of a process's output, for error messages.
std::string Tail(const std::string& text, size_t limit = 600) {
  std::string t(absl::StripTrailingAsciiWhitespace(text));
  return t.size() <= limit ? t : "..." + t.substr(t.size() - limit);
}

}  // namespace

absl::StatusOr<ProbeResult> ParseProbeJson(absl::string_view json) {
  ProbeResult r;
  int64_t small = 0, large = 0;
  if (!JsonInt(json, "fixed_bytes", &r.fixed_bytes) || !JsonInt(json, "per_sample_bytes", &r.per_sample_bytes) ||
      !JsonInt(json, "model_state_bytes", &r.model_state_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("not a memory probe result: '", Tail(std::string(json)), "'"));
  }
  // "peaks": [{"batch": B1, "peak_bytes": P1}, {"batch": B2, "peak_bytes": P2}]
  const size_t second = json.find("\"batch\":", json.find("\"batch\":") + 1);
  if (JsonInt(json, "batch", &small)) r.small_batch = small;
  (void)JsonInt(json, "peak_bytes", &r.small_peak_bytes);
  if (second != absl::string_view::npos) {
    if (JsonInt(json.substr(second), "batch", &large)) r.large_batch = large;
    (void)JsonInt(json.substr(second), "peak_bytes", &r.large_peak_bytes);
  }
  return r;
}

absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> ProcessMemoryProbe::Create(Options options) {
  if (options.worker_binary.empty()) return absl::InvalidArgumentError("memory probe: no worker binary");
  if (options.small_batch < 1 || options.large_batch <= options.small_batch) {
    return absl::InvalidArgumentError(absl::StrCat("memory probe: need 1 <= small batch < large batch (got ",
                                                   options.small_batch, ", ", options.large_batch, ")"));
  }
  std::error_code error;
  std::filesystem::create_directories(options.work_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory probe: cannot create ", options.work_dir, ": ", error.message()));
  }
  return std::unique_ptr<ProcessMemoryProbe>(new ProcessMemoryProbe(std::move(options)));
}

absl::StatusOr<ProbeResult> ProcessMemoryProbe::Probe(const fitrun::v1::JobSpec& spec) {
  absl::StatusOr<ProbeResult> small = RunOnce(spec, options_.small_batch, options_.large_batch);
  if (!small.ok() || !options_.large_batches) return small;
  ProbeResult result = *small;
  result.small_fixed_bytes = small->fixed_bytes;
  result.small_per_sample_bytes = small->per_sample_bytes;

  // Large enough that activations are about twice the small-batch fixed cost.
  int64_t b3 = small->per_sample_bytes > 0 ? 2 * small->fixed_bytes / small->per_sample_bytes : options_.min_large_batch;
  b3 = std::clamp(b3, options_.min_large_batch, options_.max_large_batch / 2);
  if (small->per_sample_bytes > 0) {
    b3 = std::min(b3, (options_.max_probe_bytes - small->fixed_bytes) / (2 * small->per_sample_bytes));
  }
  absl::StatusOr<ModelProfile> profile = fitrun::server::ProfileFor(spec);
  if (profile.ok() && profile->train_samples > 0) b3 = std::min(b3, profile->train_samples / 2);
  if (b3 <= options_.large_batch) return result;  // no room for larger batches: the small line it is
  absl::StatusOr<ProbeResult> large = RunOnce(spec, b3, 2 * b3);
  if (!large.ok()) return large.status();
  result.fixed_bytes = large->fixed_bytes;
  result.per_sample_bytes = large->per_sample_bytes;
  result.large_batch = large->large_batch;
  result.small_peak_bytes = large->small_peak_bytes;
  result.large_peak_bytes = large->large_peak_bytes;
  return result;
}

absl::StatusOr<ProbeResult> ProcessMemoryProbe::RunOnce(const fitrun::v1::JobSpec& spec, int64_t small_batch,
                                                        int64_t large_batch) {
  // A one-rank assignment: the probe reads only the spec and rank 0's threads.
  fitrun::v1::WorkerAssignment assignment;
  assignment.set_job_id("memory-probe");
  *assignment.mutable_spec() = spec;
  assignment.add_cpu_threads(options_.cpu_threads);
  std::string text;
  google::protobuf::TextFormat::PrintToString(assignment, &text);
  const std::string path =
      (std::filesystem::path(options_.work_dir) / absl::StrCat("probe-", getpid(), "-", next_id_++, ".textproto"))
          .string();
  {
    std::ofstream out(path);
    out << text;
    if (!out.good()) return absl::InternalError(absl::StrCat("memory probe: cannot write ", path));
  }
  struct RemoveFile {
    std::string path;
    ~RemoveFile() { std::remove(path.c_str()); }
  } remove_file{path};

  std::vector<std::string> args = {options_.worker_binary, "--probe",
                                   absl::StrCat("--probe_batches=", small_batch, ",", large_batch)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "FITRUN_ASSIGNMENT=", 18) != 0) env.emplace_back(*e);
  }
  env.push_back(absl::StrCat("FITRUN_ASSIGNMENT=", path));
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  const ChildSpawnAttributes attributes(/*own_process_group=*/false);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, attributes.get(), argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("memory probe: cannot start ", options_.worker_binary, ": ", std::strerror(rc)));
  }

  // Read both pipes to their end or the deadline.
  std::string out, err;
  const absl::Time deadline = absl::Now() + options_.timeout;
  bool timed_out = false;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&out, &err};
  int open_fds = 2;
  while (open_fds > 0) {
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (wait_ms <= 0) {
      timed_out = true;
      break;
    }
    const int ready = poll(fds, 2, static_cast<int>(std::min<int64_t>(wait_ms, 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  if (timed_out) kill(pid, SIGKILL);
  for (const pollfd& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat("memory probe: fitrun-worker --probe took longer than ",
                                                    absl::FormatDuration(options_.timeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = WIFEXITED(status) ? absl::StrCat("exited with ", WEXITSTATUS(status))
                                              : absl::StrCat("was killed by signal ", WTERMSIG(status));
    // Exit 2 is a bad spec: the worker names the field.
    return absl::InvalidArgumentError(absl::StrCat("memory probe: fitrun-worker --probe ", how, ": ", Tail(err)));
  }
  absl::StatusOr<ProbeResult> r = ParseProbeJson(out);
  if (!r.ok()) return r;
  // The step's overall peaks as a line (the worker's own fixed/per-sample figures are backward's).
  if (r->large_batch > r->small_batch && r->large_peak_bytes > 0) {
    r->per_sample_bytes = static_cast<int64_t>(std::llround(static_cast<double>(r->large_peak_bytes - r->small_peak_bytes) /
                                                            static_cast<double>(r->large_batch - r->small_batch)));
    r->fixed_bytes = r->small_peak_bytes - r->per_sample_bytes * r->small_batch;
  }
  return r;
}

}  // namespace fitrun::server
