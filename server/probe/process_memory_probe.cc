#include "server/probe/process_memory_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "proto/contract/launch_contract.h"
#include "fitrun/v1/worker.pb.h"
#include "google/protobuf/text_format.h"
#include "proto/contract/log.h"
#include "server/core/specs/job_specs.h"
#include "server/core/units.h"
#include "server/spawn/spawn.h"

namespace fitrun::server {
namespace {

// The number after "name": in the probe's flat JSON line, as written (empty when absent).
absl::string_view JsonNumber(absl::string_view json, absl::string_view name) {
  const std::string quoted = absl::StrCat("\"", name, "\":");
  const size_t at = json.find(quoted);
  if (at == absl::string_view::npos) return {};
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(json.substr(at + quoted.size()));
  size_t end = 0;
  while (end < rest.size() && absl::string_view("-+.0123456789eE").find(rest[end]) != absl::string_view::npos) ++end;
  return rest.substr(0, end);
}

bool JsonInt(absl::string_view json, absl::string_view name, int64_t* value) {
  return absl::SimpleAtoi(JsonNumber(json, name), value);
}

bool JsonDouble(absl::string_view json, absl::string_view name, double* value) {
  return absl::SimpleAtod(JsonNumber(json, name), value);
}

// The string after "name":, its escapes decoded: a message that quotes a process's output keeps
// its lines (a script's traceback reads as one, not as "ended with:nTraceback ...").
bool JsonString(absl::string_view json, absl::string_view name, std::string* value) {
  const std::string quoted = absl::StrCat("\"", name, "\": \"");
  size_t at = json.find(quoted);
  if (at == absl::string_view::npos) return false;
  value->clear();
  for (at += quoted.size(); at < json.size() && json[at] != '"'; ++at) {
    if (json[at] != '\\' || at + 1 >= json.size()) {
      value->push_back(json[at]);
      continue;
    }
    const char escaped = json[++at];
    switch (escaped) {
      case 'n': value->push_back('\n'); break;
      case 't': value->push_back('\t'); break;
      case 'r': value->push_back('\r'); break;
      case 'b': value->push_back('\b'); break;
      case 'f': value->push_back('\f'); break;
      case 'u': {
        // \uXXXX: ASCII as itself; anything else (never sent by fitrun-worker) as '?'.
        unsigned code = 0;
        const bool hex = at + 4 < json.size() &&
                         absl::SimpleHexAtoi(json.substr(at + 1, 4), &code);
        value->push_back(hex && code < 0x80 ? static_cast<char>(code) : '?');
        if (hex) at += 4;
        break;
      }
      default: value->push_back(escaped);  // \" \\ \/
    }
  }
  return true;
}

// The last `limit` bytes of a process's output, for error messages (which reach the job's events,
// an admin's terminal and fitrund's log): control characters but newlines and tabs escaped, and not
// starting inside a UTF-8 character (the message may become a string field).
std::string Tail(const std::string& text, size_t limit = 600) {
  const absl::string_view t = absl::StripTrailingAsciiWhitespace(text);
  size_t start = t.size() <= limit ? 0 : t.size() - limit;
  while (start < t.size() && (static_cast<unsigned char>(t[start]) & 0xC0) == 0x80) ++start;
  std::string out = start > 0 ? "..." : "";
  for (const char c : t.substr(start)) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\n' && c != '\t') || byte == 0x7f) {
      out += absl::StrFormat("\\x%02x", byte);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// How long a pending line on the probe's stdout may grow: a header or measurement line is well
// under 1 KiB, and fitrund must not hold whatever the job's code writes without a newline.
constexpr size_t kMaxLineBytes = 64 * 1024;
// How long a probe whose stdout closed has to exit, and its stderr to reach its end: a child it
// left holding stderr (which its owner controls) must not keep the calibrator waiting.
constexpr absl::Duration kEndGrace = absl::Seconds(2);

// Writes all of `data` to the probe's stdin (its owner can stop it and fill the pipe) until
// `deadline` (server/spawn's WriteToPipeWithin). A reader that exited is EPIPE instead of the
// process-wide SIGPIPE: the signal is blocked on this thread for the write, and one it raised is
// taken before unblocking.
absl::Status WriteBy(int fd, std::string_view data, absl::Duration deadline) {
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  const absl::Status written = WriteToPipeWithin(fd, data, deadline);
  if (absl::IsUnavailable(written) && !sigismember(&old, SIGPIPE)) {
    const timespec no_wait{0, 0};
    sigtimedwait(&pipe_only, nullptr, &no_wait);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return written;
}

// Kills what is left in a probe's cgroup and removes it, saying on fitrund's log what failed.
void RemoveCgroup(JobCgroup& cgroup) {
  absl::Status status = cgroup.KillAll(absl::Seconds(5));
  if (status.ok()) status = cgroup.Remove();
  if (!status.ok()) contract::LogWarning("memory probe: %s", status.message());
}

// A running fitrun-worker --probe: its pipes, and what it has written so far.
class ProcessSession final : public MemoryProbeSession {
 public:
  ProcessSession(pid_t pid, int in, int out, int err, std::string assignment_path, absl::Duration measure_timeout,
                 std::unique_ptr<JobCgroup> cgroup)
      : pid_(pid), in_(in), out_(out), err_(err), assignment_path_(std::move(assignment_path)),
        measure_timeout_(measure_timeout), cgroup_(std::move(cgroup)) {}

  ~ProcessSession() override {
    // End of input ends the probe; one that does not go is killed.
    if (in_ >= 0) close(in_);
    if (pid_ > 0) ReapBy(absl::Now() + kEndGrace);
    if (out_ >= 0) close(out_);
    if (err_ >= 0) close(err_);
    std::remove(assignment_path_.c_str());
    // Whatever the probe (a script) started goes with it.
    if (cgroup_ != nullptr) RemoveCgroup(*cgroup_);
  }

  // Waits for the header line.
  absl::Status Begin(absl::Duration timeout) {
    absl::StatusOr<std::string> line = ReadLine(timeout, "loading the workload");
    if (!line.ok()) return line.status();
    absl::StatusOr<ProbeLine> header = ParseProbeLine(*line);
    if (!header.ok()) return header.status();
    if (header->model_state_bytes < 0 || header->train_samples < 0) {
      return absl::InternalError(absl::StrCat("memory probe: expected its header line, got '", Tail(*line), "'"));
    }
    model_state_bytes_ = header->model_state_bytes;
    train_samples_ = header->train_samples;
    return absl::OkStatus();
  }

  int64_t model_state_bytes() const override { return model_state_bytes_; }
  int64_t train_samples() const override { return train_samples_; }

  absl::StatusOr<int64_t> MeasurePeak(int64_t batch) override {
    const std::string request = absl::StrCat(batch, "\n");
    const absl::Status sent = in_ < 0 ? absl::UnavailableError("its input is closed")
                                      : WriteBy(in_, request, measure_timeout_);
    if (!sent.ok()) {
      if (absl::IsDeadlineExceeded(sent)) {
        if (pid_ > 0) kill(pid_, SIGKILL);
        return absl::DeadlineExceededError(absl::StrCat("memory probe: sending it micro-batch ", batch,
                                                        " took longer than ", absl::FormatDuration(measure_timeout_),
                                                        " (its input was not read); it was stopped"));
      }
      return absl::InternalError(absl::StrCat("memory probe: cannot send it a batch size: ", Tail(stderr_)));
    }
    absl::StatusOr<std::string> line = ReadLine(measure_timeout_, absl::StrCat("measuring micro-batch ", batch));
    if (!line.ok()) return line.status();
    absl::StatusOr<ProbeLine> measured = ParseProbeLine(*line);
    if (!measured.ok()) return measured.status();
    if (measured->out_of_memory) {
      return absl::ResourceExhaustedError(absl::StrCat("micro-batch ", batch, ": ", measured->error));
    }
    if (!measured->error.empty()) {
      // A script killed by the kernel at the probe's host memory limit (its cgroup's, as a rank's):
      // that batch does not fit, as one past the device's budget does not.
      if (const int64_t kills = HostMemoryOomKills(); kills > oom_kills_seen_) {
        oom_kills_seen_ = kills;
        return absl::ResourceExhaustedError(absl::StrCat(
            "micro-batch ", batch, ": the kernel's OOM killer stopped the script at the probe's host memory limit "
            "(the device's budget plus what a process needs beside it, or spec.resources.host_memory)"));
      }
      return absl::InternalError(absl::StrCat("memory probe at micro-batch ", batch, ": ", measured->error));
    }
    if (measured->batch != batch || measured->peak_bytes < 0) {
      return absl::InternalError(absl::StrCat("memory probe: asked for micro-batch ", batch, ", got '", *line, "'"));
    }
    last_step_seconds_ = measured->step_seconds;
    return measured->peak_bytes;
  }

  double last_step_seconds() const override { return last_step_seconds_; }

  // The kernel's OOM kills in the probe's cgroup so far (0 without one).
  int64_t HostMemoryOomKills() const {
    if (cgroup_ == nullptr) return 0;
    absl::StatusOr<int64_t> kills = cgroup_->HostMemoryOomKills();
    return kills.ok() ? *kills : 0;
  }

 private:
  // The next line on stdout, reading stderr meanwhile (so the child never blocks on it); an error
  // naming `what` when the child ends, the timeout passes or the line passes kMaxLineBytes first.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout, const std::string& what) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (const size_t newline = stdout_.find('\n'); newline != std::string::npos) {
        std::string line = stdout_.substr(0, newline);
        stdout_.erase(0, newline + 1);
        return line;
      }
      if (stdout_.size() > kMaxLineBytes) {
        // Nothing more it writes is read as an answer: the session reads as ended from now on.
        if (pid_ > 0) kill(pid_, SIGKILL);
        CloseFd(&out_);
        stdout_.clear();
        return absl::InternalError(absl::StrCat("memory probe: while ", what, ", it wrote more than ",
                                                kMaxLineBytes, " bytes on stdout without a newline; it was stopped"));
      }
      if (out_ < 0) return Ended(what);
      const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (wait_ms <= 0) {
        if (pid_ > 0) kill(pid_, SIGKILL);
        return absl::DeadlineExceededError(absl::StrCat("memory probe: ", what, " took longer than ",
                                                        absl::FormatDuration(timeout)));
      }
      pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
      const int ready = poll(fds, err_ >= 0 ? 2 : 1, static_cast<int>(std::min<int64_t>(wait_ms, 1000)));
      if (ready < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) ReadSome(&out_, &stdout_);
      if (err_ >= 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) ReadSome(&err_, &stderr_);
    }
  }

  // One read of a ready pipe into `sink` (stderr's last 8 KiB to 16 KiB, for messages); closes it at
  // its end.
  void ReadSome(int* fd, std::string* sink) {
    char buffer[4096];
    const ssize_t n = read(*fd, buffer, sizeof(buffer));
    if (n > 0) {
      sink->append(buffer, static_cast<size_t>(n));
      if (sink == &stderr_ && stderr_.size() > 16384) stderr_.erase(0, stderr_.size() - 8192);
    } else if (n == 0 || errno != EINTR) {
      CloseFd(fd);
    }
  }

  // Waits until `deadline` for the probe to exit, then kills it; reaps it either way.
  ChildExit ReapBy(absl::Time deadline) {
    const pid_t pid = pid_;
    pid_ = -1;  // reaped: never waited for or killed again
    int status = 0;
    while (true) {
      const pid_t reaped = waitpid(pid, &status, WNOHANG);
      if (reaped == pid) return ChildExitFromWaitStatus(status);
      if (reaped < 0 && errno != EINTR) return ChildExit{};
      if (absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    kill(pid, SIGKILL);
    return Reap(pid);
  }

  // The probe ended before answering (its stdout closed): how, with what it said on stderr.
  absl::Status Ended(const std::string& what) {
    const absl::Time deadline = absl::Now() + kEndGrace;
    if (pid_ > 0) how_it_ended_ = ReapBy(deadline).Describe();
    // What it started goes too, so that stderr ends once what they wrote is read. A writer outside
    // its cgroup (or with none) is not waited for past the grace; what is already in the pipe is read
    // even when the probe took all of the grace to exit.
    if (cgroup_ != nullptr) (void)cgroup_->KillAll(kEndGrace);
    const absl::Time drain_until = std::max(deadline, absl::Now() + absl::Milliseconds(100));
    for (absl::Time now = absl::Now(); err_ >= 0 && now < drain_until; now = absl::Now()) {
      pollfd fd = {err_, POLLIN, 0};
      const int ready = poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(drain_until - now)) + 1);
      if (ready == 0 || (ready < 0 && errno != EINTR)) break;
      if (ready > 0) ReadSome(&err_, &stderr_);
    }
    // Exit 2 is a spec it cannot run: the worker names the field.
    return absl::InvalidArgumentError(
        absl::StrCat("memory probe: fitrun-worker --probe ", how_it_ended_, " while ", what, ": ", Tail(stderr_)));
  }

  pid_t pid_;
  int in_, out_, err_;
  const std::string assignment_path_;
  const absl::Duration measure_timeout_;
  const std::unique_ptr<JobCgroup> cgroup_;  // null without job cgroups
  std::string stdout_, stderr_;
  std::string how_it_ended_;
  int64_t model_state_bytes_ = 0;
  int64_t train_samples_ = 0;
  double last_step_seconds_ = 0;
  int64_t oom_kills_seen_ = 0;
};

}  // namespace

absl::StatusOr<ProbeLine> ParseProbeLine(absl::string_view json) {
  ProbeLine line;
  const bool header = JsonInt(json, "model_state_bytes", &line.model_state_bytes) &&
                      JsonInt(json, "train_samples", &line.train_samples);
  const bool measured = JsonInt(json, "batch", &line.batch);
  if (!header && !measured) {
    return absl::InvalidArgumentError(absl::StrCat("not a memory probe line: '", Tail(std::string(json)), "'"));
  }
  if (measured && !JsonString(json, "error", &line.error) && !JsonInt(json, "peak_bytes", &line.peak_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("memory probe line without a peak: '", Tail(std::string(json)), "'"));
  }
  if (!JsonDouble(json, "step_seconds", &line.step_seconds) || line.step_seconds < 0) line.step_seconds = 0;
  line.out_of_memory = json.find("\"out_of_memory\": true") != absl::string_view::npos;
  return line;
}

std::string ProbeDeviceOf(const std::vector<fitrun::v1::Device>& offered) {
  const fitrun::v1::Device* roomiest = nullptr;
  for (const fitrun::v1::Device& device : offered) {
    if (device.kind() != fitrun::v1::DEVICE_KIND_CUDA || absl::StrContains(device.id(), "/")) continue;
    if (roomiest == nullptr || device.total_bytes() > roomiest->total_bytes()) roomiest = &device;
  }
  return roomiest == nullptr ? "" : roomiest->id();
}

absl::StatusOr<std::unique_ptr<ProcessMemoryProbe>> ProcessMemoryProbe::Create(Options options) {
  if (options.worker_binary.empty()) return absl::InvalidArgumentError("memory probe: no worker binary");
  std::error_code error;
  std::filesystem::create_directories(options.work_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory probe: cannot create ", options.work_dir, ": ", error.message()));
  }
  return std::unique_ptr<ProcessMemoryProbe>(new ProcessMemoryProbe(std::move(options)));
}

absl::StatusOr<std::unique_ptr<MemoryProbeSession>> ProcessMemoryProbe::Start(const fitrun::v1::JobSpec& spec,
                                                                               int64_t max_bytes,
                                                                               const std::string& run_as) {
  // A job's workload is measured with its owner's rights: the probe runs the job's code.
  std::optional<UnixAccount> account;
  std::string dataset_cache_dir = options_.dataset_cache_dir;
  if (!run_as.empty()) {
    absl::StatusOr<UnixAccount> found = LookUpUnixAccount(run_as);
    if (!found.ok()) return absl::FailedPreconditionError(absl::StrCat("memory probe: ", found.status().message()));
    account = *found;
    if (!dataset_cache_dir.empty()) {
      absl::StatusOr<std::string> own = AccountSubdirectory(dataset_cache_dir, *account);
      if (!own.ok()) return own.status();
      dataset_cache_dir = *own;
    }
  }
  const std::string& binary =
      spec.has_script() && !options_.script_binary.empty() ? options_.script_binary : options_.worker_binary;
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("memory probe: cannot start ", binary, ": ", std::strerror(errno)));
  }
  // A one-rank assignment: the probe reads the spec, rank 0's threads and its memory cap, and from the
  // plan the GPU it runs a script on or times a built-in workload's steps on (none: the host).
  fitrun::v1::WorkerAssignment assignment;
  assignment.set_job_id("memory-probe");
  *assignment.mutable_spec() = spec;
  assignment.add_cpu_threads(options_.cpu_threads);
  assignment.add_memory_cap_bytes(std::max<int64_t>(0, max_bytes));
  assignment.set_dataset_cache_dir(dataset_cache_dir);
  if (!options_.probe_device_id.empty()) assignment.mutable_plan()->add_device_ids(options_.probe_device_id);
  std::string text;
  google::protobuf::TextFormat::PrintToString(assignment, &text);
  const std::string name = absl::StrCat("probe-", getpid(), "-", next_id_++);
  const std::string path = (std::filesystem::path(options_.work_dir) / absl::StrCat(name, ".textproto")).string();
  {
    std::ofstream out(path);
    out << text;
    if (!out.good()) return absl::InternalError(absl::StrCat("memory probe: cannot write ", path));
  }
  if (account.has_value()) {
    if (absl::Status given = GiveToAccount(path, *account, 0600); !given.ok()) {
      std::remove(path.c_str());
      return given;
    }
  }

  std::vector<std::string> args = {binary, "--probe"};
  if (options_.nice > 0) args.insert(args.begin(), {"/usr/bin/nice", "-n", absl::StrCat(options_.nice)});
  absl::StatusOr<Pipe> in_pipe = MakePipe();
  if (!in_pipe.ok()) return in_pipe.status();
  absl::StatusOr<Pipe> out_pipe = MakePipe();
  absl::StatusOr<Pipe> err_pipe = out_pipe.ok() ? MakePipe() : out_pipe;
  if (!err_pipe.ok()) {
    for (absl::StatusOr<Pipe>* pipe : {&in_pipe, &out_pipe}) {
      if (pipe->ok()) {
        CloseFd(&(*pipe)->read_end);
        CloseFd(&(*pipe)->write_end);
      }
    }
    return err_pipe.status();
  }
  // Bounded as a rank of the job would be: the probe runs the job's code, a script's children too.
  std::unique_ptr<JobCgroup> cgroup;
  if (options_.cgroups != nullptr) {
    CgroupLimits limits;
    absl::StatusOr<int64_t> host = ParseByteSize(spec.resources().host_memory());
    limits.memory_bytes = host.ok() ? *host : std::max<int64_t>(0, max_bytes) + kRankProcessHostBytes;
    limits.max_tasks = spec.resources().max_processes() > 0 ? spec.resources().max_processes()
                                                             : kDefaultProcessesPerRank;
    absl::StatusOr<std::unique_ptr<JobCgroup>> made = options_.cgroups->Make(name, limits);
    if (!made.ok()) {
      for (int* fd : {&in_pipe->read_end, &in_pipe->write_end, &out_pipe->read_end, &out_pipe->write_end,
                      &err_pipe->read_end, &err_pipe->write_end}) {
        CloseFd(fd);
      }
      std::remove(path.c_str());
      return absl::FailedPreconditionError(absl::StrCat("memory probe: ", made.status().message()));
    }
    cgroup = *std::move(made);
  }
  SpawnOptions spawn;
  spawn.argv = args;
  if (cgroup != nullptr) spawn.cgroup_procs_files = cgroup->ProcsFiles();
  spawn.env = {{fitrun::contract::launch::kAssignment, path}};
  spawn.stdin_fd = in_pipe->read_end;
  spawn.stdout_fd = out_pipe->write_end;
  spawn.stderr_fd = err_pipe->write_end;
  // In fitrund's process group: a probe is fitrund's own work, not a job's; it ends when its input
  // (fitrund's end of the pipe) closes.
  spawn.own_process_group = false;
  spawn.run_as = account;  // a session of its own then (server/spawn)
  absl::StatusOr<pid_t> pid = Spawn(spawn);
  for (int* fd : {&in_pipe->read_end, &out_pipe->write_end, &err_pipe->write_end}) CloseFd(fd);
  if (!pid.ok()) {
    for (int* fd : {&in_pipe->write_end, &out_pipe->read_end, &err_pipe->read_end}) CloseFd(fd);
    std::remove(path.c_str());
    if (cgroup != nullptr) RemoveCgroup(*cgroup);
    return absl::FailedPreconditionError(absl::StrCat("memory probe: ", pid.status().message()));
  }
  auto session = std::make_unique<ProcessSession>(*pid, in_pipe->write_end, out_pipe->read_end, err_pipe->read_end, path,
                                                  options_.measure_timeout, std::move(cgroup));
  if (absl::Status status = session->Begin(options_.start_timeout); !status.ok()) return status;
  return session;
}

}  // namespace fitrun::server
