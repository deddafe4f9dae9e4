// Writes a watched job's events to a stream. On a terminal the progress line is redrawn in place;
// into a pipe or a log it is printed as its own line at most every kLogInterval, so logs stay
// readable however often the ranks report.
#ifndef FITRUN_CLIENT_WATCH_PRINTER_H_
#define FITRUN_CLIENT_WATCH_PRINTER_H_

#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "client/watch_state.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::client {

// Thread-compatible: owned by the thread that reads the stream. Does not own `out`.
class WatchPrinter {
 public:
  // Ranks report several times a second; a terminal needs no more than this to look live.
  static constexpr absl::Duration kRedrawInterval = absl::Milliseconds(100);
  static constexpr absl::Duration kLogInterval = absl::Seconds(2);

  // `redraw_in_place`: stdout is a terminal that understands '\r' and "erase to end of line".
  WatchPrinter(std::ostream* out, bool redraw_in_place)
      : out_(out), redraw_in_place_(redraw_in_place) {}

  // Prints what the event means and, when due, the progress line. `now` is the local clock: it
  // paces output, while rates use the events' own times.
  void OnEvent(const v1::JobEvent& event, absl::Time now);

  // Leaves the output clean before anything else is printed: ends a redrawn line, or prints the
  // latest progress if the throttle held it back, so the last step reached is always visible.
  void Finish();

  const WatchState& state() const { return state_; }

 private:
  void DrawProgress(absl::Time now);
  void ClearProgress();

  std::ostream* out_;
  const bool redraw_in_place_;
  WatchState state_;
  // The progress line currently on screen (redraw mode only).
  bool progress_on_screen_ = false;
  // Progress changed since the line was last drawn.
  bool progress_pending_ = false;
  absl::Time last_drawn_ = absl::InfinitePast();
};

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_WATCH_PRINTER_H_
