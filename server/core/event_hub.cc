#include "server/core/event_hub.h"


namespace fitrun::server {

void EventHub::RestoreSequence(const std::string& job_id, int64_t last_sequence) {
  absl::MutexLock lock(&mu_);
  JobLog& log = logs_[job_id];
  log.last_sequence = std::max(log.last_sequence, last_sequence);
}

void EventHub::Publish(fitrun::v1::JobEvent event) {
  const std::string job_id = event.job_id();
  std::vector<std::shared_ptr<Listener>> listeners;
  {
    absl::MutexLock lock(&mu_);
    JobLog& log = logs_[job_id];
    // A sequence that is not the next one would break the tail's density; start the tail afresh.
    if (event.sequence() != log.last_sequence + 1) log.tail.clear();
    log.last_sequence = event.sequence();
    log.tail.push_back(std::move(event));
    if (log.tail.size() > options_.tail_capacity) log.tail.pop_front();
    listeners = ListenersFor(job_id);
  }
  for (const auto& listener : listeners) (*listener)();
}

EventHub::ReadResult EventHub::Read(const std::string& job_id, int64_t from_sequence, size_t limit) const {
  ReadResult result;
  absl::MutexLock lock(&mu_);
  auto it = logs_.find(job_id);
  if (it == logs_.end()) return result;
  const JobLog& log = it->second;
  result.last_sequence = log.last_sequence;
  if (log.tail.empty()) return result;
  result.oldest_retained = log.tail.front().sequence();
  if (from_sequence < result.oldest_retained) return result;
  // The tail is dense, so the event with sequence s sits at index s - oldest.
  for (size_t i = static_cast<size_t>(from_sequence - result.oldest_retained);
       i < log.tail.size() && result.events.size() < limit; ++i) {
    result.events.push_back(log.tail[i]);
  }
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
