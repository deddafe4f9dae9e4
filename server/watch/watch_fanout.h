#ifndef FITRUN_SERVER_WATCH_WATCH_FANOUT_H_
#define FITRUN_SERVER_WATCH_WATCH_FANOUT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace fitrun::server {

// The thread (by default one) that feeds streams following jobs' events (gRPC WatchJob streams,
// the web page's event streams). Publishing an event only marks its
// watchers as having news (O(1) each); this thread reads and writes for them, so however many
// watchers there are and however slow they are, ingest never waits on them.
//
// Passes are at least `window` apart: a wake that comes when the last pass started longer ago than
// that runs at once (an idle job's event goes straight out), and wakes during the window wait for
// its end, so a busy job's events reach each watcher a batch per message (at most about one message
// per watcher per `window`) rather than one message per event. Fan-out costs then grow with
// watchers times passes, not watchers times events. `threads` > 1 splits each pass's watchers
// between that many threads.
class WatchFanout {
 public:
  struct Options {
    absl::Duration window = absl::Milliseconds(1);
    // Wait the whole window after every wake, even after an idle spell (the older behaviour; for
    // comparison in the benchmark).
    bool always_wait = false;
    int threads = 1;
  };
  // Timing counters, read by the benchmark.
  struct Stats {
    int64_t passes = 0;
    int64_t pumps = 0;         // watcher wakes run (each reads the tail and may start one write)
    absl::Duration pumping;    // time spent running them, summed over threads
  };
  explicit WatchFanout(Options options);
  WatchFanout() : WatchFanout(Options{}) {}
  ~WatchFanout();
  // Runs `pump` on the fan-out thread soon; repeated calls before it runs collapse into one.
  void Schedule(const std::shared_ptr<std::atomic<bool>>& pending, std::function<void()> pump);
  Stats stats() const;

 private:
  void Run();

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // The pass being run: wakes not yet claimed by a thread start at next_.
  std::vector<std::function<void()>> pass_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_pass_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_WATCH_WATCH_FANOUT_H_
