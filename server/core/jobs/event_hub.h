// Job events: sequencing, a bounded in-memory tail per job, and fan-out to watchers.
//
// Watchers do not get events pushed into their own queues; each keeps a cursor (the next sequence
// it wants) and reads from the job's tail when woken. Publishing therefore costs the same however
// many watchers there are and however slow they are: a slow watcher only falls behind, and one that
// falls behind the tail is told which sequences it missed (or the caller replays them from the
// store). Thread-safe; listeners run on the publishing thread, outside the hub's lock.
//
// Each event is kept once, immutable and shared, together with its serialized form: a fan-out to
// many watchers copies pointers under the lock and bytes outside it, never protos.
#ifndef FITRUN_SERVER_CORE_JOBS_EVENT_HUB_H_
#define FITRUN_SERVER_CORE_JOBS_EVENT_HUB_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

class EventHub {
 public:
  using Listener = std::function<void()>;

  // An event as kept in the tail: the proto and its wire encoding (JobEvent::SerializeAsString).
  struct StoredEvent {
    fitrun::v1::JobEvent event;
    std::string serialized;
  };
  using EventRef = std::shared_ptr<const StoredEvent>;
  static EventRef MakeRef(fitrun::v1::JobEvent event);

  struct Options {
    // Events kept in memory per job; older ones are only in the store.
    size_t tail_capacity = 4096;
  };

  explicit EventHub(Options options) : options_(options) {}
  EventHub() : EventHub(Options{}) {}

  // Continues a job's numbering after a restart: the next event gets last_sequence + 1.
  void RestoreSequence(const std::string& job_id, int64_t last_sequence);
  // Drops what is kept of a job the coordinator forgets (retention) and wakes its listeners.
  void Forget(const std::string& job_id);

  // Keeps an event that already carries its job id, time and sequence number (NextSequence of its
  // job: one publisher per job numbers its events) and wakes the job's listeners.
  void Publish(fitrun::v1::JobEvent event);
  // Keeps several events of one job (consecutive sequences, in order) and wakes its listeners once.
  void Publish(std::vector<fitrun::v1::JobEvent> events);
  int64_t NextSequence(const std::string& job_id) const { return LastSequence(job_id) + 1; }

  struct ReadResult {
    std::vector<fitrun::v1::JobEvent> events;
    // Sequence of the oldest event still in memory (0 when none); a read from below it returns
    // nothing and the caller replays [from, oldest_retained) from the store.
    int64_t oldest_retained = 0;
    int64_t last_sequence = 0;
  };
  // Up to `limit` events with sequence >= from_sequence.
  ReadResult Read(const std::string& job_id, int64_t from_sequence, size_t limit) const;
  // The same without copying events: shared references to the kept events.
  struct SharedReadResult {
    std::vector<EventRef> events;
    int64_t oldest_retained = 0;
    int64_t last_sequence = 0;
  };
  SharedReadResult ReadShared(const std::string& job_id, int64_t from_sequence, size_t limit) const;

  int64_t LastSequence(const std::string& job_id) const;

  // `listener` runs after every event published for the job. It may run once more after
  // Unsubscribe returns (calls are made outside the lock), so it must hold only weak references.
  int64_t Subscribe(const std::string& job_id, Listener listener);
  void Unsubscribe(int64_t subscription);
  // Wakes the job's listeners without an event (e.g. the job ended and streams should finish).
  void Wake(const std::string& job_id);

 private:
  struct JobLog {
    int64_t last_sequence = 0;
    std::deque<EventRef> tail;
  };
  std::vector<std::shared_ptr<Listener>> ListenersFor(const std::string& job_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::map<std::string, JobLog> logs_ ABSL_GUARDED_BY(mu_);
  struct Subscription {
    std::string job_id;
    std::shared_ptr<Listener> listener;
  };
  std::map<int64_t, Subscription> subscriptions_ ABSL_GUARDED_BY(mu_);
  int64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
};

// The oneof name of an event ("progress", "state_changed", ...), for metrics and logs.
std::string EventKind(const fitrun::v1::JobEvent& event);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_EVENT_HUB_H_
