// Folds a job's event stream into what `fitrun watch` shows: one line per event worth telling and a
// progress line aggregated over ranks. Knows nothing about gRPC or terminals, so tests feed it
// JobEvent protos and read back the text.
#ifndef FITRUN_CLIENT_WATCH_STATE_H_
#define FITRUN_CLIENT_WATCH_STATE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::client {

// Training progress of the whole job at one moment, aggregated over its ranks.
struct AggregateProgress {
  // Minimum over the ranks' latest steps: the job is only as far along as its slowest rank.
  int64_t step = 0;
  int64_t total_steps = 0;
  int32_t epoch = 0;
  // Rank 0's: every rank reports the global mean loss, so one rank speaks for all.
  bool has_loss = false;
  double loss = 0;
  // Rank 0's own figures (a script's run.report(metrics=...)), formatted, sorted by name.
  std::vector<std::pair<std::string, std::string>> metrics;
  // Sum over ranks: each rank reports only the samples it processed.
  double samples_per_second = 0;
  int ranks_reporting = 0;
  // From the plan in force; 0 until a plan has been seen.
  int world_size = 0;
  // From the recent step rate; empty until two distinct steps have been seen.
  std::optional<absl::Duration> eta;
};

// Thread-compatible: owned by the thread that reads the stream.
class WatchState {
 public:
  // How far back the step rate looks: long enough to smooth per-step jitter, short enough to follow a
  // job whose speed changed (a restart with a different plan, a neighbour leaving the GPU).
  static constexpr absl::Duration kRateWindow = absl::Seconds(30);

  WatchState() = default;

  // Folds one event in and returns the lines worth printing for it (state changes, plans, OOMs,
  // checkpoints, logs, rank exits); progress only updates the aggregate and returns nothing.
  // Events at or below last_sequence() are ignored, so a resumed stream may overlap the old one.
  // `received_at` stands in for the event's time when the coordinator did not stamp it.
  std::vector<std::string> Apply(const v1::JobEvent& event, absl::Time received_at);

  bool has_progress() const { return !latest_by_rank_.empty(); }
  AggregateProgress progress() const;
  // "step 120/1875 (6.4%)  epoch 1  loss 0.5123  1234 samples/s  ETA 2m15s"; empty without progress.
  std::string ProgressLine() const;

  // The sequence to resume after: a new WatchJob from last_sequence() + 1 continues seamlessly.
  int64_t last_sequence() const { return last_sequence_; }
  v1::JobState state() const { return state_; }

 private:
  // A new attempt restarts its ranks from a checkpoint: old steps and rates would mislead.
  void ResetProgress();
  void RecordStep(absl::Time time);
  std::optional<double> StepsPerSecond() const;

  std::map<int32_t, v1::Progress> latest_by_rank_;
  // (time, aggregate step) whenever the aggregate step advanced, oldest first, within kRateWindow.
  std::deque<std::pair<absl::Time, int64_t>> step_samples_;
  v1::Plan plan_;
  int64_t last_sequence_ = 0;
  v1::JobState state_ = v1::JOB_STATE_UNSPECIFIED;
};

// "2 devices (cpu:0, cpu:1), per-device batch 64, grad accum 2, lr 0.002, predicted peak 412.3 MiB":
// the plan on one line, as watch announces it and get summarises it.
std::string DescribePlan(const v1::Plan& plan);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_WATCH_STATE_H_
