#include "server/watch/watch_cursor.h"

#include <algorithm>
#include <utility>

#include <google/protobuf/util/time_util.h>

namespace fitrun::server {

absl::StatusOr<std::vector<EventHub::EventRef>> WatchCursor::Next(size_t limit) {
  std::vector<EventHub::EventRef> out;
  EventHub::SharedReadResult read = manager_->events().ReadShared(job_id_, next_, limit);
  if (read.events.empty() && next_ <= read.last_sequence) {
    if (following_ && read.oldest_retained > next_) {
      fitrun::v1::JobEvent missed;
      missed.set_job_id(job_id_);  // sequence 0: not one of the job's events
      *missed.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
      missed.mutable_missed()->set_first_sequence(next_);
      missed.mutable_missed()->set_last_sequence(read.oldest_retained - 1);
      out.push_back(EventHub::MakeRef(std::move(missed)));
      next_ = read.oldest_retained;
      read = manager_->events().ReadShared(job_id_, next_, limit - 1);
    } else {
      absl::StatusOr<std::vector<fitrun::v1::JobEvent>> stored = manager_->ReadEvents(job_id_, next_, static_cast<int>(limit));
      if (!stored.ok()) return stored.status();
      for (fitrun::v1::JobEvent& event : *stored) out.push_back(EventHub::MakeRef(std::move(event)));
    }
  } else {
    following_ = true;  // the tail serves this watcher (or it is level with the job)
  }
  out.insert(out.end(), read.events.begin(), read.events.end());
  for (const EventHub::EventRef& ref : out) {
    const fitrun::v1::JobEvent& event = ref->event;
    if (event.sequence() == 0) continue;
    next_ = event.sequence() + 1;
    if (event.has_state_changed() && JobManager::IsTerminal(event.state_changed().to())) end_ = event.sequence();
  }
  return out;
}

}  // namespace fitrun::server
