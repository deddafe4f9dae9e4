#include "client/commands.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/format.h"
#include "client/loss_curve.h"
#include "client/render.h"
#include "client/top.h"
#include "client/watch_printer.h"

namespace fitrun::client {
namespace {

// "error: NOT_FOUND: job j-7 not found": the code tells scripts and people what kind of failure it
// is; the message is the coordinator's, verbatim, because it names the offending spec field.
int ReportRpcError(const CommandEnv& env, const absl::Status& status) {
  *env.err << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
           << std::endl;
  return ExitCodeForRpcError(status);
}

int ReportLocalError(const CommandEnv& env, const absl::Status& status) {
  *env.err << "error: " << status.message() << std::endl;
  return kExitLocalError;
}

int PrintJson(const CommandEnv& env, const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message);
  if (!json.ok()) return ReportLocalError(env, json.status());
  *env.out << *json << std::flush;
  return kExitOk;
}

RenderContext MakeRenderContext(const CommandEnv& env) { return {env.now(), env.zone}; }

int ExitCodeForOutcome(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case v1::JOB_STATE_CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitJobFailed;
  }
}

// Follows the job's events into `printer` until the coordinator ends the stream. Starts after the
// last event the printer has seen, so calling it again on the same printer resumes a broken watch
// without repeating or losing events.
absl::Status FollowEvents(const CommandEnv& env, const std::string& job_id, WatchPrinter* printer) {
  return env.coordinator->WatchJob(
      job_id, printer->state().last_sequence() + 1,
      [&](const v1::JobEvent& event) { printer->OnEvent(event, env.now()); });
}

// ANSI (VT100) control sequences for top's in-place redraw.
constexpr char kHideCursor[] = "\033[?25l";
constexpr char kShowCursor[] = "\033[?25h";
constexpr char kClearScreen[] = "\033[2J";
constexpr char kHome[] = "\033[H";
constexpr char kEraseToEndOfLine[] = "\033[K";
constexpr char kEraseBelow[] = "\033[J";

// How soon top notices Ctrl-C while it waits for the next refresh.
constexpr absl::Duration kInterruptCheck = absl::Milliseconds(100);

absl::StatusOr<TopSnapshot> FetchTop(const CommandEnv& env) {
  TopSnapshot snapshot;
  absl::StatusOr<v1::ListDevicesResponse> devices = env.coordinator->ListDevices();
  if (!devices.ok()) return devices.status();
  snapshot.devices = *std::move(devices);
  absl::StatusOr<v1::ListJobsResponse> jobs = env.coordinator->ListJobs(TopJobStates());
  if (!jobs.ok()) return jobs.status();
  snapshot.jobs = *std::move(jobs);
  return snapshot;
}

}  // namespace

bool IsTransportError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

int ExitCodeForRpcError(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  return IsTransportError(status) ? kExitTransport : kExitRejected;
}

absl::StatusOr<std::string> ReadSpecFile(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot read spec file ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[64 * 1024];
  size_t read;
  while ((read = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) text.append(buffer, read);
  // A directory opens fine and fails on the first read (EISDIR).
  if (std::ferror(file.get())) {
    return absl::DataLossError(
        absl::StrCat("cannot read spec file ", path, ": ", std::strerror(errno)));
  }
  return text;
}

int RunSubmit(const CommandEnv& env, const std::string& spec_path, bool watch) {
  absl::StatusOr<std::string> spec_yaml = ReadSpecFile(spec_path);
  if (!spec_yaml.ok()) return ReportLocalError(env, spec_yaml.status());
  absl::StatusOr<v1::Job> job = env.coordinator->SubmitJob(*spec_yaml);
  if (!job.ok()) return ReportRpcError(env, job.status());
  *env.out << "submitted job " << job->id() << std::endl;
  if (!watch) return kExitOk;
  return RunWatch(env, job->id());
}

int RunWatch(const CommandEnv& env, const std::string& job_id) {
  WatchPrinter printer(env.out, env.out_is_terminal);
  absl::Status stream_status = FollowEvents(env, job_id, &printer);
  // A coordinator that restarts drops every stream; the job goes on, so reconnect and resume
  // from the last event seen: the coordinator replays the rest from its store.
  const absl::Time give_up = env.now() + env.reconnect_for;
  absl::Duration backoff = absl::Milliseconds(200);
  bool announced = false;
  while (IsTransportError(stream_status) && env.now() < give_up) {
    if (!announced) {
      printer.Finish();
      *env.err << "lost the coordinator (" << stream_status.message() << "); reconnecting to resume after event "
               << printer.state().last_sequence() << std::endl;
      announced = true;
    }
    env.sleep(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
    const int64_t before = printer.state().last_sequence();
    stream_status = FollowEvents(env, job_id, &printer);
    if (printer.state().last_sequence() > before) announced = false;  // it was back for a while
  }
  printer.Finish();

  if (!stream_status.ok()) {
    const int code = ReportRpcError(env, stream_status);
    // Only a stream that delivered something can have broken mid-job; otherwise the error itself
    // (e.g. "failed to connect") says everything.
    if (IsTransportError(stream_status) && printer.state().last_sequence() > 0) {
      *env.err << "the event stream of job " << job_id << " broke after event "
               << printer.state().last_sequence()
               << "; the job itself is unaffected: run `fitrun watch " << job_id
               << "` to follow it again" << std::endl;
    }
    return code;
  }

  absl::StatusOr<v1::Job> job = env.coordinator->GetJob(job_id);
  if (!job.ok()) return ReportRpcError(env, job.status());
  if (!IsTerminal(job->state())) {
    *env.err << "error: the coordinator ended the event stream of job " << job_id
             << " while it is still " << StateName(job->state()) << " (after event "
             << printer.state().last_sequence() << ")" << std::endl;
    return kExitTransport;
  }
  *env.out << RenderOutcome(*job) << std::flush;
  return ExitCodeForOutcome(job->state());
}

int RunGet(const CommandEnv& env, const std::string& job_id, bool json) {
  absl::StatusOr<v1::Job> job = env.coordinator->GetJob(job_id);
  if (!job.ok()) return ReportRpcError(env, job.status());
  if (json) return PrintJson(env, *job);
  // The loss curve comes from the job's events so far; a job that has reported no progress has none.
  LossCurve curve;
  if (job->last_progress().step() > 0 && job->last_sequence() > 0) {
    const absl::Status read = env.coordinator->ReadJobEvents(
        job_id, 1, job->last_sequence(), [&](const v1::JobEvent& event) { curve.Add(event); });
    // The job itself was read; without its history it is still worth printing.
    if (!read.ok()) {
      *env.err << "note: loss curve left out: " << absl::StatusCodeToString(read.code()) << ": " << read.message()
               << std::endl;
      curve = LossCurve();
    }
  }
  *env.out << RenderJob(*job, MakeRenderContext(env), curve.points()) << std::flush;
  return kExitOk;
}

int RunEvents(const CommandEnv& env, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = env.coordinator->GetJob(job_id);
  if (!job.ok()) return ReportRpcError(env, job.status());
  if (job->last_sequence() == 0) return kExitOk;
  absl::Status printed;
  const absl::Status read = env.coordinator->ReadJobEvents(job_id, 1, job->last_sequence(), [&](const v1::JobEvent& event) {
    absl::StatusOr<std::string> line = ToJson(event, /*one_line=*/true);
    if (!line.ok()) {
      printed.Update(line.status());
      return;
    }
    *env.out << *line;
  });
  env.out->flush();
  if (!read.ok()) return ReportRpcError(env, read);
  if (!printed.ok()) return ReportLocalError(env, printed);
  return kExitOk;
}

int RunList(const CommandEnv& env, bool json, const std::vector<std::string>& states) {
  std::vector<v1::JobState> wanted;
  for (const std::string& name : states) {
    v1::JobState state;
    if (!v1::JobState_Parse("JOB_STATE_" + absl::AsciiStrToUpper(name), &state) ||
        state == v1::JOB_STATE_UNSPECIFIED) {
      *env.err << "error: --state: unknown state '" << name
               << "'; use queued, planning, running, restarting, succeeded, failed or cancelled" << std::endl;
      return kExitUsage;
    }
    wanted.push_back(state);
  }
  absl::StatusOr<v1::ListJobsResponse> jobs = env.coordinator->ListJobs(wanted);
  if (!jobs.ok()) return ReportRpcError(env, jobs.status());
  if (json) return PrintJson(env, *jobs);
  *env.out << RenderJobTable(*jobs, MakeRenderContext(env)) << std::flush;
  return kExitOk;
}

int RunLogs(const CommandEnv& env, const std::string& job_id, int rank, bool follow) {
  const absl::Status status = env.coordinator->StreamLogs(job_id, rank, follow, [&](const v1::LogChunk& chunk) {
    *env.out << chunk.data() << std::flush;
  });
  if (!status.ok()) return ReportRpcError(env, status);
  return kExitOk;
}

int RunCancel(const CommandEnv& env, const std::string& job_id, const std::string& reason) {
  absl::StatusOr<v1::Job> job = env.coordinator->CancelJob(job_id, reason);
  if (!job.ok()) return ReportRpcError(env, job.status());
  // Ranks take a moment to stop, so the job may not be CANCELLED yet when the call returns.
  if (job->state() == v1::JOB_STATE_CANCELLED) {
    *env.out << "cancelled job " << job_id << std::endl;
  } else {
    *env.out << "cancelling job " << job_id << " (now " << StateName(job->state()) << ")"
             << std::endl;
  }
  return kExitOk;
}

int RunPlan(const CommandEnv& env, const std::string& spec_path, bool json) {
  absl::StatusOr<std::string> spec_yaml = ReadSpecFile(spec_path);
  if (!spec_yaml.ok()) return ReportLocalError(env, spec_yaml.status());
  absl::StatusOr<v1::PlanJobResponse> plan = env.coordinator->PlanJob(*spec_yaml);
  if (!plan.ok()) return ReportRpcError(env, plan.status());
  if (json) return PrintJson(env, *plan);
  *env.out << RenderPlan(*plan) << std::flush;
  return kExitOk;
}

int RunDevices(const CommandEnv& env, bool json) {
  absl::StatusOr<v1::ListDevicesResponse> devices = env.coordinator->ListDevices();
  if (!devices.ok()) return ReportRpcError(env, devices.status());
  if (json) return PrintJson(env, *devices);
  *env.out << RenderDeviceTable(*devices) << std::flush;
  return kExitOk;
}

int RunTop(const CommandEnv& env, const TopOptions& options) {
  if (options.interval <= absl::ZeroDuration()) {
    *env.err << "error: --interval: must be positive (got " << absl::FormatDuration(options.interval) << ")"
             << std::endl;
    return kExitUsage;
  }
  if (!env.out_is_terminal || options.once) {
    absl::StatusOr<TopSnapshot> snapshot = FetchTop(env);
    if (!snapshot.ok()) return ReportRpcError(env, snapshot.status());
    // A terminal still gets lines cut to its width; a pipe gets them whole.
    const TopLayout layout{env.out_is_terminal ? env.terminal_size().columns : 0, 0};
    *env.out << RenderTop(*snapshot, MakeRenderContext(env), layout) << std::flush;
    return kExitOk;
  }

  *env.out << kHideCursor << kClearScreen;
  while (!env.interrupted()) {
    const TerminalSize size = env.terminal_size();
    // One row fewer than the screen: a newline on the last row would scroll the frame's top away.
    const TopLayout layout{size.columns, size.rows > 1 ? size.rows - 1 : 0};
    absl::StatusOr<TopSnapshot> snapshot = FetchTop(env);
    std::string frame;
    if (snapshot.ok()) {
      frame = RenderTop(*snapshot, MakeRenderContext(env), layout);
    } else if (IsTransportError(snapshot.status())) {
      // A restarting coordinator is back within seconds; keep refreshing.
      frame = RenderTopUnavailable(
          absl::StrCat(absl::StatusCodeToString(snapshot.status().code()), ": ", snapshot.status().message()),
          MakeRenderContext(env), layout);
    } else {
      *env.out << kShowCursor << std::flush;
      return ReportRpcError(env, snapshot.status());
    }
    // Over the previous frame line by line, erasing what each line leaves of it, then everything
    // below: no blank flash between frames.
    std::string screen = kHome;
    for (absl::string_view line : absl::StrSplit(absl::StripSuffix(frame, "\n"), '\n')) {
      absl::StrAppend(&screen, line, kEraseToEndOfLine, "\n");
    }
    absl::StrAppend(&screen, kEraseBelow);
    *env.out << screen << std::flush;

    const absl::Time next = env.now() + options.interval;
    while (!env.interrupted() && env.now() < next) env.sleep(std::min(kInterruptCheck, next - env.now()));
  }
  *env.out << kShowCursor << std::flush;
  return kExitOk;
}

}  // namespace fitrun::client
