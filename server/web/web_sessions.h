// Who is asking, on fitrund's metrics port: the web page, its JSON API and /metrics answer the same
// users as the gRPC API (server/auth/Authenticator). Plain C++: web_server.cc hands it what a request
// carried (WebCredentials, read from the Authorization and Cookie headers and the TLS handshake) and
// gets a Caller or UNAUTHENTICATED.
//
// A request is its bearer token's user, else its verified client certificate's (with mutual TLS, as
// on the gRPC port), else its session's.
// A session is what the page holds instead of a token (a browser's EventSource cannot send headers):
// StartSession takes a token the user pasted once and returns a random 256-bit id (OpenSSL's CSPRNG)
// for the fitrun_session cookie. The table keeps, per session, the token's SHA-256 (never the token)
// and checks it against the Authenticator on every request, so a token that a reload removed, or
// gave to another user, ends its sessions at once, and a changed role applies at once. A session
// lasts Options::lifetime from its start; at most Options::max_sessions are held, the oldest evicted
// first, and at most Options::max_sessions_per_user of one user's, that user's oldest evicted first
// (so one user cannot evict everyone's). Only a token fitrund knows starts one, so strangers cannot
// grow the table.
//
// Local mode (an unsecured Authenticator, or none): every request is the local admin, as on the gRPC
// port, and no session is made. /metrics is open in local mode and with Options::metrics_public;
// otherwise any user's credential may read it (Prometheus scrapes with a token of its own user).
// Which jobs' series a scrape shows is the caller's (MayScrape says who it is).
//
// Thread-safe: every method may be called from any of the HTTP server's threads.
#ifndef FITRUN_SERVER_WEB_WEB_SESSIONS_H_
#define FITRUN_SERVER_WEB_WEB_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/auth/authenticator.h"

namespace fitrun::server {

// What one HTTP request carried, as the transport found it ("" for each one it did not carry).
struct WebCredentials {
  std::string bearer_token;      // after "Bearer " in the Authorization header
  std::string session_id;        // the fitrun_session cookie
  std::string certificate_name;  // the common name of a client certificate the TLS handshake verified
};

class WebSessions {
 public:
  static constexpr char kCookieName[] = "fitrun_session";

  struct Options {
    // How long a session lasts from its start (not renewed by use).
    absl::Duration lifetime = absl::Hours(12);
    // Sessions held at once, and of one user; the oldest (of all, of that user's) is evicted to
    // make room.
    int max_sessions = 4096;
    int max_sessions_per_user = 16;
    // /metrics answers anyone (Prometheus on a trusted network), not only users.
    bool metrics_public = false;
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  // `authenticator` (nullptr: local mode) must outlive this.
  WebSessions(Options options, const Authenticator* authenticator);
  WebSessions(const WebSessions&) = delete;
  WebSessions& operator=(const WebSessions&) = delete;

  bool secured() const { return authenticator_ != nullptr && authenticator_->secured(); }

  // The caller the request speaks for, or UNAUTHENTICATED saying what to send. A bearer token that
  // is wrong is refused even beside a good session or certificate: what a client sends explicitly is
  // what counts. Then a verified client certificate (as on the gRPC port), then the session.
  absl::StatusOr<Caller> Identify(const WebCredentials& credentials);
  // Who a /metrics scrape is: the caller its credential names (the local admin in local mode), or
  // nullopt for an anonymous scrape Options::metrics_public lets in (it sees no job's series);
  // UNAUTHENTICATED otherwise.
  absl::StatusOr<std::optional<Caller>> MayScrape(const WebCredentials& credentials);

  struct NewSession {
    std::string id;  // for the cookie; empty in local mode (no session is needed)
    Caller caller;
    absl::Time expires;
  };
  // A session for the token's user. A token fitrund does not know is UNAUTHENTICATED with the same
  // message whatever was wrong with it: the answer says yes or no, nothing more.
  absl::StatusOr<NewSession> StartSession(const std::string& token);
  // Ends the session (an unknown id is fine: signing out twice is not an error).
  void EndSession(const std::string& session_id);
  // Sessions held now (expired ones included until they are swept).
  int size() const;

  // The header-level parts, so the transport only copies strings in and out.
  // The token of "Bearer <token>" (the scheme in any case), or "".
  static std::string BearerToken(absl::string_view authorization_header);
  // The fitrun_session cookie's value from a Cookie header, or "" when absent or not an id this
  // class could have made.
  static std::string SessionCookie(absl::string_view cookie_header);
  // Set-Cookie values: the session's cookie (HttpOnly, SameSite=Strict, Path=/, Max-Age of the
  // lifetime; Secure when the browser came over HTTPS), and one that deletes it.
  std::string SessionCookieHeader(const std::string& session_id, bool secure) const;
  static std::string ClearedCookieHeader(bool secure);

 private:
  struct Session {
    std::string token_hash;
    std::string user;
    absl::Time expires;
    uint64_t age = 0;  // its place in by_age_
  };
  // Drops expired sessions; oldest first, so it stops at the first live one.
  void SweepLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Authenticator* const authenticator_;
  mutable absl::Mutex mu_;
  // Keyed by the SHA-256 of the id, so that looking one up compares hashes, not the secret itself.
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> by_age_ ABSL_GUARDED_BY(mu_);  // start order -> key
  uint64_t next_age_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_WEB_WEB_SESSIONS_H_
