#include "server/core/jobs/event_hub.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace fitrun::server {
namespace {

fitrun::v1::JobEvent LogEvent(const std::string& job_id, int64_t sequence, const std::string& text) {
  fitrun::v1::JobEvent event;
  event.set_job_id(job_id);
  event.set_sequence(sequence);
  event.mutable_log()->set_text(text);
  return event;
}

void PublishN(EventHub& hub, const std::string& job_id, int n) {
  for (int i = 0; i < n; ++i) hub.Publish(LogEvent(job_id, hub.NextSequence(job_id), std::to_string(i)));
}

TEST(EventHubTest, ReadsFromAnySequenceInOrder) {
  EventHub hub;
  PublishN(hub, "j", 10);
  EventHub::ReadResult read = hub.Read("j", 4, 100);
  ASSERT_EQ(read.events.size(), 7u);
  for (size_t i = 0; i < read.events.size(); ++i) EXPECT_EQ(read.events[i].sequence(), 4 + static_cast<int64_t>(i));
  EXPECT_EQ(read.last_sequence, 10);
}

TEST(EventHubTest, JobsAreNumberedIndependently) {
  EventHub hub;
  PublishN(hub, "a", 3);
  PublishN(hub, "b", 1);
  EXPECT_EQ(hub.LastSequence("a"), 3);
  EXPECT_EQ(hub.LastSequence("b"), 1);
  EXPECT_EQ(hub.Read("b", 1, 10).events.at(0).log().text(), "0");
}

TEST(EventHubTest, ListenersOfTheJobAreWokenAndOthersAreNot) {
  EventHub hub;
  int woken_a = 0;
  int woken_b = 0;
  hub.Subscribe("a", [&] { ++woken_a; });
  const int64_t sub_b = hub.Subscribe("b", [&] { ++woken_b; });
  PublishN(hub, "a", 2);
  EXPECT_EQ(woken_a, 2);
  EXPECT_EQ(woken_b, 0);
  hub.Unsubscribe(sub_b);
  PublishN(hub, "b", 1);
  EXPECT_EQ(woken_b, 0);
}

TEST(EventHubTest, TailIsBoundedAndSaysWhatItNoLongerHolds) {
  EventHub hub(EventHub::Options{.tail_capacity = 5});
  PublishN(hub, "j", 12);
  EventHub::ReadResult old = hub.Read("j", 1, 100);
  EXPECT_TRUE(old.events.empty());
  EXPECT_EQ(old.oldest_retained, 8);
  EventHub::ReadResult recent = hub.Read("j", 8, 100);
  EXPECT_EQ(recent.events.size(), 5u);
}

TEST(EventHubTest, ABatchIsKeptInOrderWithOneWakeAndItsSerializedForm) {
  EventHub hub(EventHub::Options{.tail_capacity = 8});
  int woken = 0;
  hub.Subscribe("j", [&] { ++woken; });
  std::vector<fitrun::v1::JobEvent> batch;
  for (int i = 1; i <= 10; ++i) batch.push_back(LogEvent("j", i, std::to_string(i)));
  hub.Publish(std::move(batch));
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(hub.LastSequence("j"), 10);
  // Bounded even when one batch is larger than the tail.
  EventHub::SharedReadResult read = hub.ReadShared("j", 1, 100);
  EXPECT_TRUE(read.events.empty());
  EXPECT_EQ(read.oldest_retained, 3);
  read = hub.ReadShared("j", 3, 100);
  ASSERT_EQ(read.events.size(), 8u);
  EXPECT_EQ(read.events.back()->event.sequence(), 10);
  fitrun::v1::JobEvent parsed;
  ASSERT_TRUE(parsed.ParseFromString(read.events.front()->serialized));
  EXPECT_EQ(parsed.log().text(), "3");
  // Reading past the end gives nothing, not an error.
  EXPECT_TRUE(hub.ReadShared("j", 11, 100).events.empty());
}

TEST(EventHubTest, RestoredSequenceContinuesTheNumbering) {
  EventHub hub;
  hub.RestoreSequence("j", 41);
  EXPECT_EQ(hub.NextSequence("j"), 42);
}

// Watchers that never read do not slow publishing: the hub does no per-watcher work beyond a wake.
TEST(EventHubTest, ManyConcurrentReadersSeeIdenticalSuffixes) {
  EventHub hub;
  std::atomic<bool> done{false};
  std::thread publisher([&] {
    PublishN(hub, "j", 2000);
    done = true;
  });
  std::vector<std::vector<int64_t>> seen(4);
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      int64_t next = 1 + r * 100;
      while (!done || next <= hub.LastSequence("j")) {
        for (const auto& e : hub.Read("j", next, 16).events) {
          seen[r].push_back(e.sequence());
          next = e.sequence() + 1;
        }
      }
    });
  }
  publisher.join();
  for (auto& t : readers) t.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(seen[r].size(), static_cast<size_t>(2000 - r * 100));
    EXPECT_EQ(seen[r].front(), 1 + r * 100);
    EXPECT_EQ(seen[r].back(), 2000);
  }
}

}  // namespace
}  // namespace fitrun::server
