#include "server/core/jobs/event_hub.h"

#include <algorithm>

namespace fitrun::server {

void EventHub::RestoreSequence(const std::string& job_id, int64_t last_sequence) {
  absl::MutexLock lock(&mu_);
  JobLog& log = logs_[job_id];
  log.last_sequence = std::max(log.last_sequence, last_sequence);
}

void EventHub::Forget(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    logs_.erase(job_id);
  }
  Wake(job_id);
}

EventHub::EventRef EventHub::MakeRef(fitrun::v1::JobEvent event) {
  auto stored = std::make_shared<StoredEvent>();
  stored->event = std::move(event);
  stored->serialized = stored->event.SerializeAsString();
  return stored;
}

void EventHub::Publish(fitrun::v1::JobEvent event) {
  std::vector<fitrun::v1::JobEvent> events;
  events.push_back(std::move(event));
  Publish(std::move(events));
}

void EventHub::Publish(std::vector<fitrun::v1::JobEvent> events) {
  if (events.empty()) return;
  const std::string job_id = events.front().job_id();
  // Serialized here, on the publisher's thread and outside the lock, once for every watcher.
  std::vector<EventRef> refs;
  refs.reserve(events.size());
  for (fitrun::v1::JobEvent& event : events) refs.push_back(MakeRef(std::move(event)));
  std::vector<std::shared_ptr<Listener>> listeners;
  {
    absl::MutexLock lock(&mu_);
    JobLog& log = logs_[job_id];
    for (EventRef& ref : refs) {
      // A sequence that is not the next one would break the tail's density; start the tail afresh.
      if (ref->event.sequence() != log.last_sequence + 1) log.tail.clear();
      log.last_sequence = ref->event.sequence();
      log.tail.push_back(std::move(ref));
    }
    while (log.tail.size() > options_.tail_capacity) log.tail.pop_front();
    listeners = ListenersFor(job_id);
  }
  for (const auto& listener : listeners) (*listener)();
}

EventHub::ReadResult EventHub::Read(const std::string& job_id, int64_t from_sequence, size_t limit) const {
  SharedReadResult shared = ReadShared(job_id, from_sequence, limit);
  ReadResult result;
  result.oldest_retained = shared.oldest_retained;
  result.last_sequence = shared.last_sequence;
  result.events.reserve(shared.events.size());
  for (const EventRef& ref : shared.events) result.events.push_back(ref->event);
  return result;
}

EventHub::SharedReadResult EventHub::ReadShared(const std::string& job_id, int64_t from_sequence,
                                                size_t limit) const {
  SharedReadResult result;
  absl::MutexLock lock(&mu_);
  auto it = logs_.find(job_id);
  if (it == logs_.end()) return result;
  const JobLog& log = it->second;
  result.last_sequence = log.last_sequence;
  if (log.tail.empty()) return result;
  result.oldest_retained = log.tail.front()->event.sequence();
  if (from_sequence < result.oldest_retained) return result;
  // The tail is dense, so the event with sequence s sits at index s - oldest.
  const size_t first = static_cast<size_t>(from_sequence - result.oldest_retained);
  if (first >= log.tail.size()) return result;
  const size_t end = std::min(log.tail.size(), first + limit);
  result.events.assign(log.tail.begin() + static_cast<std::ptrdiff_t>(first),
                       log.tail.begin() + static_cast<std::ptrdiff_t>(end));
  return result;
}

int64_t EventHub::LastSequence(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = logs_.find(job_id);
  return it == logs_.end() ? 0 : it->second.last_sequence;
}

int64_t EventHub::Subscribe(const std::string& job_id, Listener listener) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_subscription_++;
  subscriptions_[id] = Subscription{job_id, std::make_shared<Listener>(std::move(listener))};
  return id;
}

void EventHub::Unsubscribe(int64_t subscription) {
  absl::MutexLock lock(&mu_);
  subscriptions_.erase(subscription);
}

void EventHub::Wake(const std::string& job_id) {
  std::vector<std::shared_ptr<Listener>> listeners;
  {
    absl::MutexLock lock(&mu_);
    listeners = ListenersFor(job_id);
  }
  for (const auto& listener : listeners) (*listener)();
}

std::vector<std::shared_ptr<EventHub::Listener>> EventHub::ListenersFor(const std::string& job_id) const {
  std::vector<std::shared_ptr<Listener>> out;
  for (const auto& [id, subscription] : subscriptions_) {
    if (subscription.job_id == job_id) out.push_back(subscription.listener);
  }
  return out;
}

std::string EventKind(const fitrun::v1::JobEvent& event) {
  const auto* field = event.GetDescriptor()->FindFieldByNumber(event.event_case());
  return field == nullptr ? "none" : field->name();
}

}  // namespace fitrun::server
