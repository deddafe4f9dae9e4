#include "server/watch/watch_fanout.h"

#include <pthread.h>

#include <algorithm>
#include <iterator>

#include "absl/time/clock.h"

namespace fitrun::server {

WatchFanout::WatchFanout(Options options) : options_(options) {
  for (int i = 0; i < std::max(1, options_.threads); ++i) {
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "watch-fanout");  // as `top -H` and profilers show it
      Run();
    });
  }
}

void WatchFanout::Run() {
  const size_t threads = static_cast<size_t>(std::max(1, options_.threads));
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || next_ < pass_.size() || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
    if (stopping_) return;
    if (next_ < pass_.size()) {
      // A share of the current pass: moved out, since the next pass replaces pass_.
      const size_t share = (pass_.size() + threads - 1) / threads;
      const size_t end = std::min(pass_.size(), next_ + share);
      std::vector<std::function<void()>> pumps(std::make_move_iterator(pass_.begin() + next_),
                                               std::make_move_iterator(pass_.begin() + end));
      next_ = end;
      mu_.Unlock();
      const absl::Time start = absl::Now();
      for (std::function<void()>& pump : pumps) pump();
      const absl::Duration took = absl::Now() - start;
      mu_.Lock();
      stats_.pumps += static_cast<int64_t>(pumps.size());
      stats_.pumping += took;
      continue;
    }
    // Let more events (and more watchers' wakes) gather until the window since the last pass ends.
    const absl::Time now = absl::Now();
    const absl::Time due = options_.always_wait ? now + options_.window : last_pass_ + options_.window;
    if (due > now) {
      mu_.Unlock();
      absl::SleepFor(due - now);
      mu_.Lock();
      if (stopping_) return;
      if (queue_.empty() || next_ < pass_.size()) continue;  // another thread started this pass
    }
    last_pass_ = absl::Now();
    ++stats_.passes;
    pass_.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
    queue_.clear();
    next_ = 0;
  }
}

WatchFanout::~WatchFanout() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

WatchFanout::Stats WatchFanout::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void WatchFanout::Schedule(const std::shared_ptr<std::atomic<bool>>& pending, std::function<void()> pump) {
  if (pending->exchange(true)) return;  // already queued; that run will see this event too
  absl::MutexLock lock(&mu_);
  queue_.push_back([pending, pump = std::move(pump)] {
    pending->store(false);
    pump();
  });
}

}  // namespace fitrun::server
