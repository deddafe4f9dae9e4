#include "client/watch_printer.h"

#include <string>
#include <vector>

namespace fitrun::client {
namespace {

// Carriage return, then ANSI "erase to end of line": the terminal's cursor is back at column 0 of
// an empty line, whatever was drawn there before.
constexpr char kClearLine[] = "\r\033[K";

}  // namespace

void WatchPrinter::OnEvent(const v1::JobEvent& event, absl::Time now) {
  const std::vector<std::string> lines = state_.Apply(event, now);
  if (event.has_progress()) progress_pending_ = true;

  if (!lines.empty()) {
    ClearProgress();
    for (const std::string& line : lines) *out_ << line << '\n';
    // The line printed over the progress line; put it back below right away.
    if (redraw_in_place_ && state_.has_progress()) {
      DrawProgress(now);
      return;
    }
  }
  if (!progress_pending_ || !state_.has_progress()) {
    out_->flush();
    return;
  }
  const absl::Duration interval = redraw_in_place_ ? kRedrawInterval : kLogInterval;
  if (now - last_drawn_ >= interval) DrawProgress(now);
  out_->flush();
}

void WatchPrinter::Finish() {
  if (progress_pending_ && state_.has_progress()) DrawProgress(last_drawn_);
  if (progress_on_screen_) {
    *out_ << '\n';
    progress_on_screen_ = false;
  }
  out_->flush();
}

void WatchPrinter::DrawProgress(absl::Time now) {
  const std::string line = state_.ProgressLine();
  if (redraw_in_place_) {
    *out_ << kClearLine << line;
    progress_on_screen_ = true;
  } else {
    *out_ << line << '\n';
  }
  progress_pending_ = false;
  last_drawn_ = now;
  out_->flush();
}

void WatchPrinter::ClearProgress() {
  if (!progress_on_screen_) return;
  *out_ << kClearLine;
  progress_on_screen_ = false;
}

}  // namespace fitrun::client
