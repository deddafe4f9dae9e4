#include "server/web/web_server.h"

#include <arpa/inet.h>

#include <CivetServer.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/live_metrics.h"
#include "server/watch/watch_cursor.h"
#include "server/web/web_sessions.h"

namespace fitrun::server {
namespace {

constexpr char kPage[] =
#include "server/web/page.html.inc"
    ;
constexpr char kLoginPage[] =
#include "server/web/login.html.inc"
    ;

// A sign-in's body holds one token: anything longer is not one.
constexpr size_t kMaxLoginBody = 8192;

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

// What every response carries: no caching (the figures change), no sniffing, no referrer, and a page
// that may only run its own inline code, talk to this server and not be framed by another site.
constexpr char kCommonHeaders[] =
    "Cache-Control: no-store\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'\r\n";

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

// `extra_headers`: whole header lines ("Name: value\r\n").
void Respond(mg_connection* connection, int status, absl::string_view content_type, absl::string_view body,
             absl::string_view extra_headers = "") {
  const std::string head =
      absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(), "\r\n", kCommonHeaders, extra_headers, "Connection: close\r\n\r\n");
  mg_write(connection, head.data(), head.size());
  mg_write(connection, body.data(), body.size());
}

void RespondJson(mg_connection* connection, int status, absl::string_view json, absl::string_view extra_headers = "") {
  Respond(connection, status, "application/json; charset=utf-8", json, extra_headers);
}

void RespondError(mg_connection* connection, int status, absl::string_view message,
                  absl::string_view extra_headers = "") {
  RespondJson(connection, status, absl::StrCat("{\"error\":", JsonString(message), "}"), extra_headers);
}

// 401: the message says what to send.
void RespondUnauthenticated(mg_connection* connection, const absl::Status& status) {
  RespondError(connection, 401, status.message(), "WWW-Authenticate: Bearer realm=\"fitrund\"\r\n");
}

// One answer for a job that does not exist and one the caller may not see, so neither is revealed.
void RespondNoJob(mg_connection* connection, const std::string& job_id) {
  RespondError(connection, 404, absl::StrCat("job_id: no job '", job_id, "'"));
}

// Whether the browser reached this server over HTTPS: this server's own, or a TLS-terminating proxy
// in front that says so. Trusting the header can only make the cookie stricter.
bool OverHttps(mg_connection* connection) {
  if (mg_get_request_info(connection)->is_ssl) return true;
  const char* proto = mg_get_header(connection, "X-Forwarded-Proto");
  return proto != nullptr && absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(proto), "https");
}

// A POST or DELETE a page of another site made the browser send carries that site's Origin; this
// server's own page sends http:// or (through a proxy) https:// and the Host it asked for.
// Requests without one (curl, scripts) are not a browser's cross-site requests.
bool SameOrigin(mg_connection* connection) {
  const char* origin = mg_get_header(connection, "Origin");
  if (origin == nullptr) return true;
  const char* host = mg_get_header(connection, "Host");
  return host != nullptr && (origin == absl::StrCat("http://", host) || origin == absl::StrCat("https://", host));
}

// The name of a Host header ("127.0.0.1:9464" -> "127.0.0.1", "[::1]:9464" -> "::1"), lowercased.
std::string HostName(absl::string_view host) {
  if (absl::ConsumePrefix(&host, "[")) return std::string(host.substr(0, host.find(']')));
  const size_t colon = host.rfind(':');
  if (colon != absl::string_view::npos && host.find(':') == colon) host = host.substr(0, colon);
  return absl::AsciiStrToLower(host);
}

bool IsIpLiteral(const std::string& name) {
  in6_addr address{};
  return inet_pton(AF_INET, name.c_str(), &address) == 1 || inet_pton(AF_INET6, name.c_str(), &address) == 1;
}

// The body, or nullopt when it is longer than `limit`.
std::optional<std::string> ReadBody(mg_connection* connection, const mg_request_info* request, size_t limit) {
  if (request->content_length > static_cast<long long>(limit)) return std::nullopt;
  std::string body;
  char buffer[1024];
  while (body.size() <= limit) {
    const int n = mg_read(connection, buffer, sizeof(buffer));
    if (n <= 0) break;
    body.append(buffer, static_cast<size_t>(n));
  }
  if (body.size() > limit) return std::nullopt;
  return body;
}

// The token a sign-in sends: {"token": "..."} as JSON, or token=... as a form.
std::string TokenFromBody(mg_connection* connection, const std::string& body) {
  const char* type = mg_get_header(connection, "Content-Type");
  const bool json = type != nullptr ? absl::StrContains(absl::AsciiStrToLower(type), "json")
                                    : absl::StartsWith(absl::StripLeadingAsciiWhitespace(body), "{");
  if (json) {
    google::protobuf::Struct parsed;
    if (!google::protobuf::util::JsonStringToMessage(body, &parsed).ok()) return "";
    auto it = parsed.fields().find("token");
    if (it == parsed.fields().end() || it->second.kind_case() != google::protobuf::Value::kStringValue) return "";
    return it->second.string_value();
  }
  std::string token(kMaxLoginBody, '\0');
  const int length = mg_get_var(body.data(), body.size(), "token", token.data(), token.size());
  return length > 0 ? token.substr(0, static_cast<size_t>(length)) : "";
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

WebSessions::Options SessionOptions(const WebServer::Options& options) {
  WebSessions::Options sessions;
  sessions.lifetime = options.session_lifetime;
  sessions.max_sessions = options.max_sessions;
  sessions.max_sessions_per_user = options.max_sessions_per_user;
  sessions.metrics_public = options.metrics_public;
  return sessions;
}

// The request's path; "/" when civetweb has none.
absl::string_view PathOf(const mg_request_info* request) {
  return request->local_uri != nullptr ? request->local_uri : "/";
}

// Refuses (403) a POST or DELETE that a page of another site made the browser send; true when refused.
bool RefusedCrossSite(mg_connection* connection) {
  if (SameOrigin(connection)) return false;
  RespondError(connection, 403, "refused: the request came from a page of another site (its Origin)");
  return true;
}

// Where an event stream starts: ?from=N (400 unless a sequence number >= 1), or just after the
// Last-Event-ID a reconnecting EventSource sends; nullopt when refused, the refusal sent.
std::optional<int64_t> EventsFrom(mg_connection* connection, const mg_request_info* request) {
  int64_t from = 1;
  const std::string from_text = QueryParameter(request, "from");
  if (!from_text.empty() && (!absl::SimpleAtoi(from_text, &from) || from < 1)) {
    RespondError(connection, 400, "from: a sequence number >= 1");
    return std::nullopt;
  }
  if (const char* last = mg_get_header(connection, "Last-Event-ID"); last != nullptr) {
    int64_t last_id = 0;
    if (absl::SimpleAtoi(last, &last_id) && last_id >= 1) from = last_id + 1;
  }
  return from;
}

// An event stream's `error` event, its last.
std::string ErrorEvent(absl::string_view message) {
  return absl::StrCat("event: error\ndata: {\"error\":", JsonString(message), "}\n\n");
}

// A batch of the job's events as server-sent events.
std::string JobEvents(const std::vector<EventHub::EventRef>& events) {
  std::string out;
  for (const EventHub::EventRef& ref : events) {
    // An EventsMissed notice (sequence 0) is not one of the job's events: no id to resume from.
    if (ref->event.sequence() > 0) absl::StrAppend(&out, "id: ", ref->event.sequence(), "\n");
    absl::StrAppend(&out, "event: job_event\ndata: ", ToJson(ref->event), "\n\n");
  }
  return out;
}

}  // namespace

// What civetweb's log callback reaches (as the CivetServer's user context): the first error civetweb
// reports while starting, for Start's answer.
struct WebServer::CivetContext {
  absl::Mutex mu;
  bool started ABSL_GUARDED_BY(mu) = false;
  std::string startup_error ABSL_GUARDED_BY(mu);
  WebTls tls;  // set before civetweb starts, read by its init_ssl step

  static CivetContext* Of(void* civet_server) {
    return static_cast<CivetContext*>(const_cast<void*>(static_cast<CivetServer*>(civet_server)->getUserContext()));
  }

  // civetweb's log: kept while starting (it is why a start failed), dropped once serving (a client
  // that goes away mid-request is not fitrund's problem to print).
  static int Log(const mg_connection* connection, const char* message) {
    void* civet_server = mg_get_user_data(mg_get_context(connection));
    if (civet_server == nullptr) return 1;  // before civetweb has its user data: nowhere to keep it
    CivetContext* self = Of(civet_server);
    absl::MutexLock lock(&self->mu);
    if (!self->started && self->startup_error.empty()) self->startup_error = message;
    return 1;
  }

  // civetweb's init_ssl: 1 (the context is set up), or -1 with the reason kept for Start's answer.
  static int InitSsl(void* ssl_context, void* civet_server) {
    CivetContext* self = Of(civet_server);
    const absl::Status status = ConfigureTlsContext(ssl_context, self->tls);
    if (status.ok()) return 1;
    absl::MutexLock lock(&self->mu);
    if (self->startup_error.empty()) self->startup_error = std::string(status.message());
    return -1;
  }
};

class WebServer::Handler : public CivetHandler {
 public:
  Handler(Options options, JobManager* manager, std::vector<std::shared_ptr<prometheus::Collectable>> collectables)
      : options_(std::move(options)),
        manager_(manager),
        collectables_(std::move(collectables)),
        live_(manager),
        sessions_(SessionOptions(options_), options_.authenticator) {}

  // Ends every open event stream; the server's threads then return.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [id, wake] : wakes_) wake->Wake();
  }

  // A request whose Host is a name this server does not go by is answered 421 and nothing else: a
  // page that rebinds its own domain name to 127.0.0.1 (DNS rebinding) would otherwise read the
  // local admin's API. An IP address, localhost, the --metrics_listen host and Options::hosts are
  // this server's names; a request without Host (no browser sends one) is let through.
  bool KnownHost(mg_connection* connection) {
    const char* host = mg_get_header(connection, "Host");
    if (host == nullptr) return true;
    const std::string name = HostName(host);
    if (name == "localhost" || IsIpLiteral(name) || name == HostName(options_.listen)) return true;
    for (const std::string& allowed : options_.hosts) {
      if (name == absl::AsciiStrToLower(allowed)) return true;
    }
    RespondError(connection, 421,
                 absl::StrCat("Host '", name, "' is not a name this server goes by; use its address, localhost, or a "
                              "name fitrund's --metrics_hosts lists"));
    return false;
  }

  // GET: /metrics, the page, or the JSON API (RouteApiGet).
  bool handleGet(CivetServer*, mg_connection* connection) override {
    if (!KnownHost(connection)) return true;
    const mg_request_info* request = mg_get_request_info(connection);
    const absl::string_view path = PathOf(request);
    const WebCredentials credentials = CredentialsOf(connection);
    if (path == "/metrics") return ServeMetrics(connection, credentials);
    if (path == "/" || path == "/index.html") return ServePage(connection, credentials);
    if (absl::StartsWith(path, "/api/")) return RouteApiGet(connection, request, credentials, path);
    RespondError(connection, 404, absl::StrCat("no page at ", path));
    return true;
  }

  // POST: signing in and out, from this server's own page only.
  bool handlePost(CivetServer*, mg_connection* connection) override {
    if (!KnownHost(connection)) return true;
    const mg_request_info* request = mg_get_request_info(connection);
    const absl::string_view path = PathOf(request);
    if (path != "/api/session" && path != "/api/logout") {
      RespondError(connection, path == "/" || absl::StartsWith(path, "/api/") ? 405 : 404,
                   absl::StrCat("POST ", path, ": only /api/session (sign in) and /api/logout (sign out) take a POST"));
      return true;
    }
    if (RefusedCrossSite(connection)) return true;
    if (path == "/api/logout") return SignOut(connection);
    return SignIn(connection, request);
  }

  // DELETE: signing out, from this server's own page only.
  bool handleDelete(CivetServer*, mg_connection* connection) override {
    if (!KnownHost(connection)) return true;
    const absl::string_view path = PathOf(mg_get_request_info(connection));
    if (path != "/api/session" && path != "/api/logout") {
      RespondError(connection, 405, absl::StrCat("DELETE ", path, ": only /api/session and /api/logout (sign out)"));
      return true;
    }
    if (RefusedCrossSite(connection)) return true;
    return SignOut(connection);
  }

 private:
  // How a stream's wait for news ended: news, the keep-alive interval without any, or the server
  // stopping.
  enum class StreamWait { kNews, kIdle, kStopping };

  // What the request carried: the only place headers are read for identity.
  WebCredentials CredentialsOf(mg_connection* connection) const {
    WebCredentials credentials;
    if (const char* authorization = mg_get_header(connection, "Authorization"); authorization != nullptr) {
      credentials.bearer_token = WebSessions::BearerToken(authorization);
    }
    if (const char* cookie = mg_get_header(connection, "Cookie"); cookie != nullptr) {
      credentials.session_id = WebSessions::SessionCookie(cookie);
    }
    // civetweb hands over any certificate the handshake took; only one a client CA verified names anyone.
    const mg_request_info* request = mg_get_request_info(connection);
    if (!options_.tls.client_ca.empty() && request->client_cert != nullptr) {
      credentials.certificate_name = CertificateCommonName(request->client_cert->peer_cert);
    }
    return credentials;
  }

  // GET /api/...: every route needs a user (401 without); then the fixed paths, a job, its events.
  bool RouteApiGet(mg_connection* connection, const mg_request_info* request, const WebCredentials& credentials,
                   absl::string_view path) {
    absl::StatusOr<Caller> caller = sessions_.Identify(credentials);
    if (!caller.ok()) {
      RespondUnauthenticated(connection, caller.status());
      return true;
    }
    if (path == "/api/session") return ServeSession(connection, *caller);
    if (path == "/api/jobs") return ServeJobs(connection, *caller);
    if (path == "/api/devices") return ServeDevices(connection, *caller);
    absl::string_view rest = path;
    if (absl::ConsumePrefix(&rest, "/api/jobs/") && !rest.empty()) {
      if (absl::ConsumeSuffix(&rest, "/events")) {
        return ServeEvents(connection, request, credentials, *caller, std::string(rest));
      }
      if (!absl::StrContains(rest, '/')) return ServeJob(connection, *caller, std::string(rest));
    }
    RespondError(connection, 404, absl::StrCat("no page at ", path));
    return true;
  }

  // Secured and signed out: the sign-in page, which comes back here once it has a session.
  bool ServePage(mg_connection* connection, const WebCredentials& credentials) {
    const bool known = sessions_.Identify(credentials).ok();
    Respond(connection, 200, "text/html; charset=utf-8", known ? kPage : kLoginPage);
    return true;
  }

  // GET /api/session: who the request is, and whether fitrund is secured.
  bool ServeSession(mg_connection* connection, const Caller& caller) {
    RespondJson(connection, 200, absl::StrCat("{\"user\":", JsonString(caller.user), ",\"admin\":",
                                              caller.admin ? "true" : "false", ",\"secured\":",
                                              sessions_.secured() ? "true" : "false", "}"));
    return true;
  }

  bool SignIn(mg_connection* connection, const mg_request_info* request) {
    std::optional<std::string> body = ReadBody(connection, request, kMaxLoginBody);
    if (!body.has_value()) {
      RespondError(connection, 413, absl::StrCat("a sign-in is at most ", kMaxLoginBody, " bytes"));
      return true;
    }
    std::string token = TokenFromBody(connection, *body);
    if (token.empty()) {
      if (const char* authorization = mg_get_header(connection, "Authorization"); authorization != nullptr) {
        token = WebSessions::BearerToken(authorization);
      }
    }
    absl::StatusOr<WebSessions::NewSession> session = sessions_.StartSession(token);
    if (!session.ok()) {
      if (absl::IsUnauthenticated(session.status())) {
        RespondUnauthenticated(connection, session.status());
      } else {
        RespondError(connection, absl::IsInvalidArgument(session.status()) ? 400 : 500, session.status().message());
      }
      return true;
    }
    std::string json = absl::StrCat("{\"user\":", JsonString(session->caller.user), ",\"admin\":",
                                    session->caller.admin ? "true" : "false");
    std::string cookie;
    if (!session->id.empty()) {
      absl::StrAppend(&json, ",\"expires_at\":", JsonString(absl::FormatTime(absl::RFC3339_sec, session->expires,
                                                                              absl::UTCTimeZone())));
      cookie = absl::StrCat("Set-Cookie: ", sessions_.SessionCookieHeader(session->id, OverHttps(connection)), "\r\n");
    }
    RespondJson(connection, 200, json + "}", cookie);
    return true;
  }

  bool SignOut(mg_connection* connection) {
    if (const char* cookie = mg_get_header(connection, "Cookie"); cookie != nullptr) {
      sessions_.EndSession(WebSessions::SessionCookie(cookie));
    }
    RespondJson(connection, 200, "{\"signed_out\":true}",
                absl::StrCat("Set-Cookie: ", WebSessions::ClearedCookieHeader(OverHttps(connection)), "\r\n"));
    return true;
  }

  // The registry's series (no job in their labels), then the devices and the jobs the scraper may
  // see: an admin's every job, a user's their own, an anonymous scrape's (--metrics_public) none.
  bool ServeMetrics(mg_connection* connection, const WebCredentials& credentials) {
    absl::StatusOr<std::optional<Caller>> scraper = sessions_.MayScrape(credentials);
    if (!scraper.ok()) {
      RespondUnauthenticated(connection, scraper.status());
      return true;
    }
    std::vector<prometheus::MetricFamily> families;
    for (const auto& collectable : collectables_) {
      std::vector<prometheus::MetricFamily> more = collectable->Collect();
      families.insert(families.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
    const std::optional<Caller>& who = *scraper;  // none: an anonymous scrape
    std::vector<prometheus::MetricFamily> live = live_.CollectFor([&who](const fitrun::v1::Job& job) {
      return who.has_value() && who->MayAccess(job.owner());
    });
    families.insert(families.end(), std::make_move_iterator(live.begin()), std::make_move_iterator(live.end()));
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    Respond(connection, 200, "text/plain; version=0.0.4; charset=utf-8", out.str());
    return true;
  }

  bool ServeJobs(mg_connection* connection, const Caller& caller) {
    std::vector<fitrun::v1::Job> jobs = manager_->List({});
    std::string json = "{\"jobs\":[";
    int listed = 0;
    for (auto it = jobs.rbegin(); it != jobs.rend() && listed < kMaxListedJobs; ++it) {
      if (!caller.MayAccess(it->owner())) continue;
      if (listed++ > 0) json += ",";
      json += ToJson(*it);
    }
    RespondJson(connection, 200, json + "]}");
    return true;
  }

  // Every device, with its memory; which job holds it only when the caller may see that job.
  bool ServeDevices(mg_connection* connection, const Caller& caller) {
    const auto visible = [&caller](const fitrun::v1::Job& job) { return caller.MayAccess(job.owner()); };
    std::string json = "{\"devices\":[";
    bool first = true;
    for (const fitrun::v1::Device& device : manager_->Devices(visible)) {
      if (!std::exchange(first, false)) json += ",";
      json += ToJson(device);
    }
    RespondJson(connection, 200, json + "]}");
    return true;
  }

  // The job when the caller may see it; NOT_FOUND alike for a job that is not there and one that
  // is another user's.
  absl::StatusOr<fitrun::v1::Job> VisibleJob(const Caller& caller, const std::string& job_id) {
    absl::StatusOr<fitrun::v1::Job> job = manager_->Get(job_id);
    if (!job.ok() || !caller.MayAccess(job->owner())) return absl::NotFoundError(job_id);
    return job;
  }

  bool ServeJob(mg_connection* connection, const Caller& caller, const std::string& job_id) {
    absl::StatusOr<fitrun::v1::Job> job = VisibleJob(caller, job_id);
    absl::StatusOr<std::vector<JobManager::RankView>> ranks =
        job.ok() ? manager_->Ranks(job_id) : absl::StatusOr<std::vector<JobManager::RankView>>(job.status());
    if (!job.ok() || !ranks.ok()) {
      RespondNoJob(connection, job_id);
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
  // ends, the page goes away, the request's credential stops being valid, or the server stops.
  bool ServeEvents(mg_connection* connection, const mg_request_info* request, const WebCredentials& credentials,
                   const Caller& caller, const std::string& job_id) {
    const std::optional<int64_t> from = EventsFrom(connection, request);
    if (!from.has_value()) return true;
    absl::StatusOr<fitrun::v1::Job> job = VisibleJob(caller, job_id);
    if (!job.ok()) {
      RespondNoJob(connection, job_id);
      return true;
    }
    const std::string owner = job->owner();
    auto wake = std::make_shared<StreamWake>();
    const std::optional<int64_t> stream_id = OpenStream(connection, caller.user, wake);
    if (!stream_id.has_value()) return true;
    WatchCursor cursor(manager_, job_id, *from);
    if (JobManager::IsTerminal(job->state())) cursor.EndAt(job->last_sequence());
    const auto pending = std::make_shared<std::atomic<bool>>(false);
    const int64_t subscription = manager_->events().Subscribe(job_id, [this, pending, weak = std::weak_ptr(wake)] {
      fanout_.Schedule(pending, [weak] {
        if (auto wake = weak.lock()) wake->Wake();
      });
    });
    const std::string head = absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n", kCommonHeaders,
                                          "Connection: close\r\n\r\n");
    if (mg_write(connection, head.data(), head.size()) > 0) StreamEvents(connection, credentials, owner, cursor, *wake);
    manager_->events().Unsubscribe(subscription);
    CloseStream(*stream_id, caller.user);
    return true;
  }

  // Counts a new stream against the server's limit (503 beyond) and its user's (429), and keeps its
  // wake-up for Stop; nullopt when refused, the refusal sent.
  std::optional<int64_t> OpenStream(mg_connection* connection, const std::string& user,
                                    std::shared_ptr<StreamWake> wake) {
    absl::MutexLock lock(&mu_);
    if (stopping_ || static_cast<int>(wakes_.size()) >= options_.max_event_streams) {
      RespondError(connection, 503, absl::StrCat(options_.max_event_streams, " event streams are open, the limit"));
      return std::nullopt;
    }
    // One user's streams leave room for everyone else's.
    if (streams_by_user_[user] >= options_.max_event_streams_per_user) {
      RespondError(connection, 429,
                   absl::StrCat(user, " has ", options_.max_event_streams_per_user,
                                " event streams open, the most one user may; close one (a page's tab) first"));
      return std::nullopt;
    }
    ++streams_by_user_[user];
    const int64_t stream_id = next_stream_++;
    wakes_[stream_id] = std::move(wake);
    return stream_id;
  }

  void CloseStream(int64_t stream_id, const std::string& user) {
    absl::MutexLock lock(&mu_);
    wakes_.erase(stream_id);
    if (--streams_by_user_[user] <= 0) streams_by_user_.erase(user);
  }

  // The stream's body: batches of events as the cursor yields them, a keep-alive comment when idle,
  // until the job ends, a write fails, the credential lapses or the server stops.
  void StreamEvents(mg_connection* connection, const WebCredentials& credentials, const std::string& owner,
                    WatchCursor& cursor, StreamWake& wake) {
    bool open = true;
    while (open) {
      {
        absl::MutexLock lock(&wake.mu);
        wake.woken = false;  // consumed before reading, so news during the read wakes the next wait
      }
      // Signed out, expired, or its token removed since the stream opened: it ends here.
      if (absl::StatusOr<Caller> now = sessions_.Identify(credentials); !now.ok() || !now->MayAccess(owner)) {
        const std::string out =
            ErrorEvent(now.ok() ? "no longer allowed to see this job" : now.status().message());
        mg_write(connection, out.data(), out.size());
        break;
      }
      absl::StatusOr<std::vector<EventHub::EventRef>> events = cursor.Next(256);
      if (!events.ok()) {
        const std::string out = ErrorEvent(events.status().message());
        mg_write(connection, out.data(), out.size());
        break;
      }
      std::string out = JobEvents(*events);
      if (cursor.Done()) out += "event: end\ndata: {}\n\n";
      if (!out.empty()) open = mg_write(connection, out.data(), out.size()) > 0;
      if (cursor.Done()) break;
      if (!events->empty()) continue;
      const StreamWait waited = AwaitNews(wake);
      if (waited == StreamWait::kStopping) break;
      if (waited == StreamWait::kIdle) open = mg_write(connection, ": keepalive\n\n", 13) > 0;
    }
  }

  // Waits up to the keep-alive interval for the stream's wake-up; the server stopping wins.
  StreamWait AwaitNews(StreamWake& wake) {
    bool woken = false;
    {
      absl::MutexLock lock(&wake.mu);
      woken = wake.mu.AwaitWithTimeout(absl::Condition(&wake.woken), options_.keepalive);
    }
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      stop = stopping_;
    }
    if (stop) return StreamWait::kStopping;
    return woken ? StreamWait::kNews : StreamWait::kIdle;
  }

  const Options options_;
  JobManager* const manager_;
  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  const LiveMetrics live_;
  WebSessions sessions_;
  WatchFanout fanout_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, std::shared_ptr<StreamWake>> wakes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> streams_by_user_ ABSL_GUARDED_BY(mu_);
  int64_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
};

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(
    Options options, JobManager* manager, std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  const size_t colon = options.listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: expected HOST:PORT, e.g. 127.0.0.1:9464 (got '", options.listen, "')"));
  }
  const bool https = !options.tls.cert.empty();
  if (https) {
    if (absl::Status prepared = PrepareCivetwebForOpenSsl3(); !prepared.ok()) return prepared;
  }
  std::unique_ptr<WebServer> server(new WebServer());
  server->context_ = std::make_unique<CivetContext>();
  server->context_->tls = options.tls;
  const int threads = options.max_event_streams + 8;  // every event stream holds one; the rest serve requests
  // civetweb's "s" suffix: this port speaks TLS only.
  // A request must arrive whole, and a reply be taken, within request_timeout: a client that sends
  // its headers a byte at a time (or never) holds one of the threads for that long at most, not
  // civetweb's 30 s default, so a few dozen slow connections cannot take the port from everyone.
  const std::vector<std::string> civet_options = {
      "listening_ports", absl::StrCat(options.listen, https ? "s" : ""), "num_threads", absl::StrCat(threads),
      "request_timeout_ms", absl::StrCat(absl::ToInt64Milliseconds(options.request_timeout)),
      "keep_alive_timeout_ms", "500"};
  CivetCallbacks callbacks;
  callbacks.log_message = &CivetContext::Log;
  if (https) callbacks.init_ssl = &CivetContext::InitSsl;
  server->handler_ = std::make_unique<Handler>(options, manager, std::move(collectables));
  try {
    server->civet_ = std::make_unique<CivetServer>(civet_options, &callbacks, server->context_.get());
  } catch (const std::exception& e) {
    absl::MutexLock lock(&server->context_->mu);
    const std::string& why = server->context_->startup_error;
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen: cannot listen on ", options.listen, ": ", why.empty() ? e.what() : why));
  }
  {
    absl::MutexLock lock(&server->context_->mu);
    server->context_->started = true;
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
