// What every kind of rank shares, whatever it trains: the connection to the coordinator (progress,
// logs, the final RankFinished / RankFailed / OutOfMemory), the StopCommand, and the mapping from how
// the rank ended to its exit code (proto/contract/launch_contract.h). A training program (the built-in
// trainer, a user's script under supervision) does the work between; the runtime makes sure the
// coordinator hears how it ended before the process exits.
#ifndef FITRUN_WORKER_RUNTIME_RANK_RUNTIME_H_
#define FITRUN_WORKER_RUNTIME_RANK_RUNTIME_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/contract/launch_contract.h"
#include "fitrun/v1/worker.pb.h"
#include "worker/options.h"
#include "worker/report/grpc_reporter.h"
#include "worker/trainer/progress_sink.h"

namespace fitrun::worker {

using ExitCode = fitrun::contract::launch::ExitCode;

// Carries a StopCommand (the reporter's reader thread) to the training program (its own thread). A
// program that cannot end at once is ended `grace` after the command: a rank stuck in a collective
// or the rendezvous must not outlive its job.
class StopSwitch {
 public:
  explicit StopSwitch(absl::Duration grace) : grace_(grace) {}

  void Stop(const std::string& reason);
  // Calls `request_stop(reason)` (from the stopping thread, with this switch locked: it must not call
  // back into it) when a stop arrives while attached; returns false when a stop already arrived.
  // Attach(nullptr) detaches.
  bool Attach(std::function<void(const std::string& reason)> request_stop);
  bool stopped() const;
  // True when a stop arrived or arrives within `timeout`.
  bool WaitForStop(absl::Duration timeout) const;
  std::string reason() const;

 private:
  const absl::Duration grace_;
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string& reason)> request_stop_ ABSL_GUARDED_BY(mu_);
};

// A device's memory as its allocator counts it.
struct MemoryFigures {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  // On a GPU (0 elsewhere): the caching allocator's reserved peak and the device's memory in use.
  int64_t reserved_peak_bytes = 0;
  int64_t device_bytes = 0;
};

// Stamps each progress report with the device allocator's live and peak bytes before passing it on.
class MemoryStampingSink final : public ProgressSink {
 public:
  MemoryStampingSink(ProgressSink* next, std::function<MemoryFigures()> measure)
      : next_(next), measure_(std::move(measure)) {}

  void OnProgress(const StepProgress& progress) override;
  void OnLog(const std::string& text) override { next_->OnLog(text); }
  void OnCheckpoint(const CheckpointNotice& checkpoint) override { next_->OnCheckpoint(checkpoint); }
  void Flush(absl::Duration timeout) override { next_->Flush(timeout); }

 private:
  ProgressSink* next_;
  std::function<MemoryFigures()> measure_;
  int64_t device_peak_ = 0;  // the highest device figure so far (the device's own has no peak)
};

class RankRuntime {
 public:
  struct Timing {
    // After a StopCommand a program has this long to end on its own.
    absl::Duration stop_grace = absl::Seconds(3);
    // How long a rank whose collective failed waits for a StopCommand that explains it.
    absl::Duration stop_race = absl::Seconds(1);
    // How long a finished rank gives its last report to reach the coordinator, which it waits to
    // have read it: on a loaded machine fitrund can take seconds to read a stream, and a report
    // given up on is the job's result lost (its steps, loss and accuracy).
    absl::Duration finish_timeout = absl::Seconds(20);
    absl::Duration fail_timeout = absl::Seconds(2);
  };

  explicit RankRuntime(const WorkerOptions& options) : RankRuntime(options, Timing()) {}
  RankRuntime(const WorkerOptions& options, Timing timing);

  // Connects to the coordinator when the options name one (standalone otherwise: the log only).
  absl::Status Start();

  const WorkerOptions& options() const { return options_; }
  // Everything the program reports: the rank's log and, when connected, the coordinator.
  ProgressSink& sink() { return *sink_; }
  // The rank's log only.
  ProgressSink& console() { return console_; }
  // The coordinator only (what is in the rank's log already); nullptr when standalone.
  ProgressSink* coordinator();
  StopSwitch& stop() { return stop_; }
  bool connected() const { return reporter_ != nullptr; }
  const Timing& timing() const { return timing_; }

  // How a rank ends; each returns the exit code for main to return.
  int Finish(const fitrun::v1::RankFinished& finished, const std::string& summary);
  int Fail(ExitCode code, const absl::Status& status);
  // The device's memory ran out: the OutOfMemory report (what the coordinator re-plans from) goes
  // out before the RankFailed. `oom.rank` is set here.
  int OutOfMemory(fitrun::v1::OutOfMemory oom, const absl::Status& status);
  int Stopped();
  // A collective that failed while the coordinator was stopping the job: the first rank to obey
  // breaks its peers' all-reduce before their own StopCommand arrives, so a failed collective
  // followed shortly by a stop is a stop.
  bool StoppedMeanwhile();

 private:
  const WorkerOptions options_;
  const Timing timing_;
  ConsoleSink console_;
  StopSwitch stop_;
  std::unique_ptr<GrpcReporter> reporter_;
  std::unique_ptr<TeeSink> sink_;
};

// A rank's work between start and end: the built-in trainer, or a user's script under supervision.
class TrainingProgram {
 public:
  virtual ~TrainingProgram() = default;
  // Runs the rank to its end on the calling thread and returns runtime.Finish/Fail/...'s exit code.
  virtual int Run(RankRuntime& runtime) = 0;
};

// Takes the job token off its descriptor (TakeJobToken), starts the runtime and runs `program` in it;
// the process's exit code.
int RunRank(const WorkerOptions& options, TrainingProgram& program);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_RUNTIME_RANK_RUNTIME_H_
