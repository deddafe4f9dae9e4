// fitrund's HTTP side, on its metrics port: /metrics for Prometheus, the web page at / and the small
// JSON API the page reads, behind the same users as the gRPC API whenever fitrund is secured (a token
// file or mutual TLS; docs/security.md). Who a request is, and the web sessions, are WebSessions'
// decision (web_sessions.h); this file reads the headers and answers.
//
//   GET /metrics                    Prometheus text format: every collectable given (no job in their
//                                    labels), the devices and the running jobs' series (live_metrics.h)
//                                    of the jobs the caller may see (an admin's: every job; local
//                                    mode: every job). Secured: any user's credential, or anyone
//                                    with Options::metrics_public (no job's series then)
//   GET /                           the page (server/web/page.html, built in; no external assets);
//                                    secured and without a credential, the sign-in page (login.html)
//   GET /api/session                who the request is: {"user", "admin", "secured"}
//   POST /api/session               signs in: the token as JSON {"token": "..."} or a form field
//                                    token=...; answers {"user", "admin", "expires_at"} with the
//                                    fitrun_session cookie (HttpOnly, SameSite=Strict; Secure behind HTTPS)
//   POST|DELETE /api/logout, DELETE /api/session   ends the request's session and clears the cookie
//   GET /api/jobs                   {"jobs": [Job, ...]}, newest first, at most kMaxListedJobs, only
//                                    those the caller may see (their own; an admin's: every job)
//   GET /api/devices                {"devices": [Device, ...]}; a device held by a job the caller may
//                                    not see shows no job_id or rank, and "held_by_another_user": true
//   GET /api/jobs/<id>              {"job": Job, "ranks": [{rank, device_id, planned_bytes, peak_bytes,
//                                    cap_bytes}, ...]}: the running attempt's ranks, else the last one's
//   GET /api/jobs/<id>/events?from=N   server-sent events: `id: <sequence>`, `event: job_event`,
//                                    `data: <JobEvent>` for every event from N (or Last-Event-ID + 1)
//                                    on, then `event: end` once the job has ended
// Secured, /api/... without a credential is 401 with {"error": what to send}; another user's job is
// 404 with the same answer as a job that does not exist. A credential is a bearer token
// (Authorization: Bearer) or the session cookie (what the page and its EventSource use). A POST or
// DELETE whose Origin is not this server is refused (403), and any request whose Host is not a name
// of this server's (421: DNS rebinding). One user holds at most Options::max_event_streams_per_user
// event streams (429 beyond) and max_sessions_per_user sessions.
// Messages are protobuf's JSON mapping with the .proto field names (int64 values as strings).
// Event streams follow a job the way WatchJob does: a WatchCursor woken through the WatchFanout; a
// stream whose credential stops being valid (signed out, expired, token removed) ends.
//
// With Options::tls (fitrund's --tls_cert and --tls_key) the port serves HTTPS only, and with a
// client CA a verified client certificate names its holder as on the gRPC port (civetweb_tls.h says
// what Debian 12's civetweb needs for it). Without, it is plain HTTP, which fitrund keeps on loopback
// unless --insecure (server.cc); the cookie is Secure over HTTPS, or when a TLS-terminating proxy in
// front says X-Forwarded-Proto: https.
#ifndef FITRUN_SERVER_WEB_WEB_SERVER_H_
#define FITRUN_SERVER_WEB_WEB_SERVER_H_

#include <prometheus/collectable.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/auth/authenticator.h"
#include "server/core/jobs/job_manager.h"
#include "server/watch/watch_fanout.h"
#include "server/web/civetweb_tls.h"

class CivetServer;

namespace fitrun::server {

class WebServer {
 public:
  struct Options {
    // HOST:PORT; port 0 picks a free one.
    std::string listen = "127.0.0.1:9464";
    // HTTPS with this certificate and key (and client certificates from tls.client_ca); empty cert:
    // plain HTTP.
    WebTls tls;
    // Event streams open at once (each holds one of the server's threads); more get 503. Of one
    // user's: more get 429.
    int max_event_streams = 32;
    int max_event_streams_per_user = 8;
    // Names this server goes by besides its addresses, localhost and the listen host (a proxy's).
    std::vector<std::string> hosts;
    // An idle event stream sends a comment this often, so a closed page is noticed.
    absl::Duration keepalive = absl::Seconds(15);
    // How long a request may take to arrive whole, and a reply to be taken (civetweb's
    // request_timeout_ms): a slow client holds a thread no longer.
    absl::Duration request_timeout = absl::Seconds(5);
    // Who may read what: the gRPC API's users. nullptr, or an Authenticator that is not secured:
    // local mode, everyone is the local admin (must outlive the server).
    const Authenticator* authenticator = nullptr;
    // Secured: /metrics answers without a credential too (Prometheus on a trusted network).
    bool metrics_public = false;
    // Web sessions: how long one lasts, and how many are held at once (the oldest go first).
    absl::Duration session_lifetime = absl::Hours(12);
    int max_sessions = 4096;
    int max_sessions_per_user = 16;
  };
  static constexpr int kMaxListedJobs = 200;

  // Serves until destroyed. `manager` and the collectables must outlive the server. The collectables
  // are shown to every scraper: none may name a job (the devices' and jobs' series are the
  // server's own, per caller).
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(
      Options options, JobManager* manager, std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  // HOST:PORT as bound (the port chosen when the options said 0).
  const std::string& address() const { return address_; }

  class Handler;  // the CivetHandler; in the .cc
  struct CivetContext;  // what civetweb's log callback reaches: start-up errors; in the .cc

 private:
  WebServer() = default;
  std::string address_;
  std::unique_ptr<CivetContext> context_;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetServer> civet_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_WEB_WEB_SERVER_H_
