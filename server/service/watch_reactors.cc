#include "server/service/watch_reactors.h"

#include "server/service/grpc_status.h"

namespace fitrun::server {
namespace {

// Appends `value` as a protobuf varint.
void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

}  // namespace

WatchJobReactor::Step WatchJobReactor::Next(fitrun::v1::JobEvent* next, grpc::Status* status) {
  if (pending_.empty()) {
    absl::StatusOr<std::vector<EventHub::EventRef>> events = cursor_.Next(kBatch);
    if (!events.ok()) {
      *status = ToGrpcStatus(events.status());
      return Step::kFinish;
    }
    pending_.assign(events->begin(), events->end());
  }
  if (!pending_.empty()) {
    *next = pending_.front()->event;
    pending_.pop_front();
    return Step::kWrite;
  }
  return cursor_.Done() ? Step::kFinish : Step::kWait;
}

WatchJobEventsReactor::Step WatchJobEventsReactor::Next(grpc::ByteBuffer* next, grpc::Status* status) {
  if (pending_.empty()) {
    absl::StatusOr<std::vector<EventHub::EventRef>> events = cursor_.Next(kMaxEvents);
    if (!events.ok()) {
      *status = ToGrpcStatus(events.status());
      return Step::kFinish;
    }
    pending_.assign(events->begin(), events->end());
  }
  if (pending_.empty()) return cursor_.Done() ? Step::kFinish : Step::kWait;
  auto* bytes = new std::string();
  while (!pending_.empty() &&
         (bytes->empty() || bytes->size() + pending_.front()->serialized.size() + 6 <= kMaxBytes)) {
    const std::string& event = pending_.front()->serialized;
    bytes->push_back(static_cast<char>((1 << 3) | 2));  // events = 1, length-delimited
    AppendVarint(event.size(), bytes);
    bytes->append(event);
    pending_.pop_front();
  }
  grpc::Slice slice(bytes->data(), bytes->size(), [](void* owned) { delete static_cast<std::string*>(owned); },
                    bytes);
  *next = grpc::ByteBuffer(&slice, 1);
  return Step::kWrite;
}

}  // namespace fitrun::server
