#include "server/web/web_server.h"

#include <CivetServer.h>
#include <google/protobuf/util/json_util.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <sstream>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "server/watch/watch_cursor.h"

namespace fitrun::server {
namespace {

constexpr char kPage[] =
#include "server/web/page.html.inc"
    ;

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrCat("\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// What every response carries: no caching (the figures change), no sniffing, and a page that may
// only run its own inline code and talk to this server.
constexpr char kCommonHeaders[] =
    "Cache-Control: no-store\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'\r\n";

void Respond(mg_connection* connection, int status, absl::string_view content_type, absl::string_view body) {
  const char* reason = status == 200 ? "OK" : status == 404 ? "Not Found" : status == 503 ? "Service Unavailable"
                                                                                          : "Bad Request";
  const std::string head =
      absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: ", content_type, "\r\nContent-Length: ",
                   body.size(), "\r\n", kCommonHeaders, "Connection: close\r\n\r\n");
  mg_write(connection, head.data(), head.size());
  mg_write(connection, body.data(), body.size());
}

void RespondJson(mg_connection* connection, int status, absl::string_view json) {
  Respond(connection, status, "application/json; charset=utf-8", json);
}

void RespondError(mg_connection* connection, int status, absl::string_view message) {
  RespondJson(connection, status, absl::StrCat("{\"error\":", JsonString(message), "}"));
}

// A query parameter's value, or "" when absent.
std::string QueryParameter(const mg_request_info* request, const char* name) {
  if (request->query_string == nullptr) return "";
  for (absl::string_view pair : absl::StrSplit(request->query_string, '&')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.first == name) return std::string(kv.second);
  }
  return "";
}

// One event stream's wake-up: set by the fan-out thread when the job has news, or by the server
// when it stops.
struct StreamWake {
  absl::Mutex mu;
  bool woken ABSL_GUARDED_BY(mu) = false;
  void Wake() {
    absl::MutexLock lock(&mu);
    woken = true;
  }
};

}  // namespace

class WebServer::Handler : public CivetHandler {
 public:
  Handler(Options options, JobManager* manager, std::vector<std::shared_ptr<prometheus::Collectable>> collectables)
      : options_(std::move(options)), manager_(manager), collectables_(std::move(collectables)) {}

  // Ends every open event stream; the server's threads then return.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [id, wake] : wakes_) wake->Wake();
  }

  bool handleGet(CivetServer*, mg_connection* connection) override {
    const mg_request_info* request = mg_get_request_info(connection);
    const absl::string_view path = request->local_uri != nullptr ? request->local_uri : "/";
    if (path == "/metrics") return ServeMetrics(connection);
    if (path == "/" || path == "/index.html") {
      Respond(connection, 200, "text/html; charset=utf-8", kPage);
      return true;
    }
    if (path == "/api/jobs") return ServeJobs(connection);
    if (path == "/api/devices") return ServeDevices(connection);
    absl::string_view rest = path;
    if (absl::ConsumePrefix(&rest, "/api/jobs/") && !rest.empty()) {
      if (absl::ConsumeSuffix(&rest, "/events")) return ServeEvents(connection, request, std::string(rest));
      if (!absl::StrContains(rest, '/')) return ServeJob(connection, std::string(rest));
    }
    RespondError(connection, 404, absl::StrCat("no page at ", path));
    return true;
  }

 private:
  bool ServeMetrics(mg_connection* connection) {
    std::vector<prometheus::MetricFamily> families;
    for (const auto& collectable : collectables_) {
      std::vector<prometheus::MetricFamily> more = collectable->Collect();
      families.insert(families.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    Respond(connection, 200, "text/plain; version=0.0.4; charset=utf-8", out.str());
    return true;
  }

  bool ServeJobs(mg_connection* connection) {
    std::vector<fitrun::v1::Job> jobs = manager_->List({});
    std::string json = "{\"jobs\":[";
    int listed = 0;
    for (auto it = jobs.rbegin(); it != jobs.rend() && listed < kMaxListedJobs; ++it, ++listed) {
      if (listed > 0) json += ",";
      json += ToJson(*it);
    }
    RespondJson(connection, 200, json + "]}");
    return true;
  }

  bool ServeDevices(mg_connection* connection) {
    std::string json = "{\"devices\":[";
    bool first = true;
    for (const fitrun::v1::Device& device : manager_->Devices()) {
      if (!std::exchange(first, false)) json += ",";
      json += ToJson(device);
    }
    RespondJson(connection, 200, json + "]}");
    return true;
  }

  bool ServeJob(mg_connection* connection, const std::string& job_id) {
    absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id);
    absl::StatusOr<std::vector<JobManager::RankView>> ranks = manager_->Ranks(job_id);
    if (!job.ok() || !ranks.ok()) {
      RespondError(connection, 404, !job.ok() ? job.status().message() : ranks.status().message());
      return true;
    }
    std::map<std::string, int64_t> capacity;
    for (const fitrun::v1::Device& device : manager_->Devices()) capacity[device.id()] = device.total_bytes();
    std::string json = absl::StrCat("{\"job\":", ToJson(*job), ",\"ranks\":[");
    for (size_t i = 0; i < ranks->size(); ++i) {
      const JobManager::RankView& rank = (*ranks)[i];
      absl::StrAppend(&json, i > 0 ? "," : "", "{\"rank\":", rank.rank, ",\"device_id\":", JsonString(rank.device_id),
                      ",\"planned_bytes\":\"", rank.planned_bytes, "\",\"peak_bytes\":\"", rank.peak_bytes,
                      "\",\"cap_bytes\":\"", capacity[rank.device_id], "\",\"last_progress\":",
                      ToJson(rank.last_progress), "}");
    }
    RespondJson(connection, 200, json + "]}");
    return true;
  }

  // A server-sent event stream of the job's events, held on this connection's thread until the job
  // ends, the page goes away or the server stops.
  bool ServeEvents(mg_connection* connection, const mg_request_info* request, const std::string& job_id) {
    int64_t from = 1;
    const std::string from_text = QueryParameter(request, "from");
    if (!from_text.empty() && (!absl::SimpleAtoi(from_text, &from) || from < 1)) {
      RespondError(connection, 400, "from: a sequence number >= 1");
      return true;
    }
    // A reconnecting EventSource says where it was.
    if (const char* last = mg_get_header(connection, "Last-Event-ID"); last != nullptr) {
      int64_t last_id = 0;
      if (absl::SimpleAtoi(last, &last_id) && last_id >= 1) from = last_id + 1;
    }
    absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id);
    if (!job.ok()) {
      RespondError(connection, 404, job.status().message());
      return true;
    }
    auto wake = std::make_shared<StreamWake>();
    int64_t stream_id = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || static_cast<int>(wakes_.size()) >= options_.max_event_streams) {
        RespondError(connection, 503, absl::StrCat(options_.max_event_streams, " event streams are open, the limit"));
        return true;
      }
      stream_id = next_stream_++;
      wakes_[stream_id] = wake;
    }
    WatchCursor cursor(manager_, job_id, from);
    if (JobManager::IsTerminal(job->state())) cursor.EndAt(job->last_sequence());
    const auto pending = std::make_shared<std::atomic<bool>>(false);
    const int64_t subscription = manager_->events().Subscribe(job_id, [this, pending, weak = std::weak_ptr(wake)] {
      fanout_.Schedule(pending, [weak] {
        if (auto wake = weak.lock()) wake->Wake();
      });
    });
    const std::string head = absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n", kCommonHeaders,
                                          "Connection: close\r\n\r\n");
    bool open = mg_write(connection, head.data(), head.size()) > 0;
    while (open) {
      {
        absl::MutexLock lock(&wake->mu);
        wake->woken = false;  // consumed before reading, so news during the read wakes the next wait
      }
      absl::StatusOr<std::vector<EventHub::EventRef>> events = cursor.Next(256);
      std::string out;
      if (!events.ok()) {
        out = absl::StrCat("event: error\ndata: {\"error\":", JsonString(events.status().message()), "}\n\n");
        mg_write(connection, out.data(), out.size());
        break;
      }
      for (const EventHub::EventRef& ref : *events) {
        // An EventsMissed notice (sequence 0) is not one of the job's events: no id to resume from.
        if (ref->event.sequence() > 0) absl::StrAppend(&out, "id: ", ref->event.sequence(), "\n");
        absl::StrAppend(&out, "event: job_event\ndata: ", ToJson(ref->event), "\n\n");
      }
      if (cursor.Done()) out += "event: end\ndata: {}\n\n";
      if (!out.empty()) open = mg_write(connection, out.data(), out.size()) > 0;
      if (cursor.Done()) break;
      if (!events->empty()) continue;
      bool stop = false;
      bool woken = false;
      {
        absl::MutexLock lock(&wake->mu);
        woken = wake->mu.AwaitWithTimeout(absl::Condition(&wake->woken), options_.keepalive);
      }
      {
        absl::MutexLock lock(&mu_);
        stop = stopping_;
      }
      if (stop) break;
      if (!woken) open = mg_write(connection, ": keepalive\n\n", 13) > 0;
    }
    manager_->events().Unsubscribe(subscription);
    absl::MutexLock lock(&mu_);
    wakes_.erase(stream_id);
    return true;
  }

  const Options options_;
  JobManager* const manager_;
  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  WatchFanout fanout_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, std::shared_ptr<StreamWake>> wakes_ ABSL_GUARDED_BY(mu_);
  int64_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
};

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(
    Options options, JobManager* manager, std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  const size_t colon = options.listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: expected HOST:PORT, e.g. 127.0.0.1:9464 (got '", options.listen, "')"));
  }
  std::unique_ptr<WebServer> server(new WebServer());
  const int threads = options.max_event_streams + 8;  // every event stream holds one; the rest serve requests
  server->handler_ = std::make_unique<Handler>(options, manager, std::move(collectables));
  try {
    server->civet_ = std::make_unique<CivetServer>(std::vector<std::string>{
        "listening_ports", options.listen, "num_threads", absl::StrCat(threads)});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics_listen: cannot listen on ", options.listen, ": ", e.what()));
  }
  server->civet_->addHandler("/", server->handler_.get());
  const std::vector<int> ports = server->civet_->getListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("--metrics_listen: not listening on ", options.listen));
  server->address_ = absl::StrCat(options.listen.substr(0, colon), ":", ports.front());
  return server;
}

WebServer::~WebServer() {
  if (handler_ != nullptr) handler_->Stop();
  if (civet_ != nullptr) civet_->close();  // joins the server's threads
}

}  // namespace fitrun::server
