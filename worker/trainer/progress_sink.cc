#include "worker/trainer/progress_sink.h"

namespace fitrun::worker {

void ConsoleSink::OnProgress(const StepProgress& p) {
  std::fprintf(out_, "[rank %d] step %lld/%lld epoch %d loss %.4f samples/s %.0f", rank_,
               static_cast<long long>(p.step), static_cast<long long>(p.total_steps), p.epoch, p.loss,
               p.samples_per_second);
  // The device's memory, where it is counted (the rank's log is where a user looks after an OOM).
  if (p.peak_bytes > 0) {
    std::fprintf(out_, " live %lld peak %lld bytes", static_cast<long long>(p.live_bytes),
                 static_cast<long long>(p.peak_bytes));
  }
  for (const auto& [name, value] : p.metrics) std::fprintf(out_, " %s %.4g", name.c_str(), value);
  std::fprintf(out_, "\n");
  std::fflush(out_);
}

void ConsoleSink::OnLog(const std::string& text) {
  std::fprintf(out_, "[rank %d] %s\n", rank_, text.c_str());
  std::fflush(out_);
}

void ConsoleSink::OnCheckpoint(const CheckpointNotice& c) {
  if (!c.error.empty()) {
    std::fprintf(out_, "[rank %d] checkpoint of step %lld failed, keeping the previous one: %s\n", rank_,
                 static_cast<long long>(c.step), c.error.c_str());
    std::fflush(out_);
    return;
  }
  std::fprintf(out_, "[rank %d] checkpoint of step %lld saved to %s (%lld bytes)\n", rank_,
               static_cast<long long>(c.step), c.path.c_str(), static_cast<long long>(c.bytes));
  std::fflush(out_);
}

void ConsoleSink::Flush(absl::Duration) { std::fflush(out_); }

void TeeSink::OnProgress(const StepProgress& progress) {
  for (ProgressSink* sink : sinks_) sink->OnProgress(progress);
}

void TeeSink::OnLog(const std::string& text) {
  for (ProgressSink* sink : sinks_) sink->OnLog(text);
}

void TeeSink::OnCheckpoint(const CheckpointNotice& checkpoint) {
  for (ProgressSink* sink : sinks_) sink->OnCheckpoint(checkpoint);
}

void TeeSink::Flush(absl::Duration timeout) {
  for (ProgressSink* sink : sinks_) sink->Flush(timeout);
}

}  // namespace fitrun::worker
