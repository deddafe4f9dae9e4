// The fan-out on its own: a wake after an idle spell runs without waiting out the window; wakes
// inside the window wait for its end and run together in one pass, a repeated wake of one watcher
// collapsing into one; several threads run every wake exactly once.
#include "server/watch/watch_fanout.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace fitrun::server {
namespace {

// Wake times, recorded by the pumps the fan-out runs.
class Recorder {
 public:
  std::function<void()> Pump() {
    return [this] {
      absl::MutexLock lock(&mu_);
      ran_.push_back(absl::Now());
    };
  }
  // Waits until `count` pumps ran (a test failure after 10 s).
  std::vector<absl::Time> WaitFor(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ran_.size() >= count; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10))) << "ran " << ran_.size();
    return ran_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Time> ran_ ABSL_GUARDED_BY(mu_);
};

TEST(WatchFanoutTest, AWakeAfterAnIdleSpellDoesNotWaitOutTheWindow) {
  // An hour's window: had the first wake waited for it, it would not run within the 10 s waited.
  WatchFanout::Options options;
  options.window = absl::Hours(1);
  WatchFanout fanout(options);
  Recorder recorder;
  fanout.Schedule(std::make_shared<std::atomic<bool>>(false), recorder.Pump());
  EXPECT_EQ(recorder.WaitFor(1).size(), 1u);
  EXPECT_EQ(fanout.stats().passes, 1);
}

TEST(WatchFanoutTest, WakesInsideTheWindowWaitForItsEndAndShareOnePass) {
  WatchFanout::Options options;
  options.window = absl::Milliseconds(300);
  WatchFanout fanout(options);
  Recorder recorder;
  auto pending_a = std::make_shared<std::atomic<bool>>(false);
  auto pending_b = std::make_shared<std::atomic<bool>>(false);
  fanout.Schedule(pending_a, recorder.Pump());
  recorder.WaitFor(1);
  // Inside the window: a twice and b once; a's second wake collapses into its first.
  fanout.Schedule(pending_a, recorder.Pump());
  fanout.Schedule(pending_a, recorder.Pump());
  fanout.Schedule(pending_b, recorder.Pump());
  const std::vector<absl::Time> ran = recorder.WaitFor(3);
  // The second pass cannot start before the window since the first pass began, which was a moment
  // before its pump stamped ran[0].
  EXPECT_GE(ran[1] - ran[0], absl::Milliseconds(295));
  // A pass counts its pumps once they have run, after the last has stamped its time: wait for that.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (fanout.stats().pumps < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  const WatchFanout::Stats stats = fanout.stats();
  EXPECT_EQ(stats.passes, 2);
  EXPECT_EQ(stats.pumps, 3);
}

TEST(WatchFanoutTest, SeveralThreadsRunEveryWakeOnce) {
  WatchFanout::Options options;
  options.threads = 2;
  WatchFanout fanout(options);
  std::atomic<int> runs{0};
  std::vector<std::shared_ptr<std::atomic<bool>>> pending;
  for (int i = 0; i < 100; ++i) {
    pending.push_back(std::make_shared<std::atomic<bool>>(false));
    fanout.Schedule(pending.back(), [&] { runs.fetch_add(1); });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (fanout.stats().pumps < 100 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(runs.load(), 100);
  EXPECT_EQ(fanout.stats().pumps, 100);
}

}  // namespace
}  // namespace fitrun::server
