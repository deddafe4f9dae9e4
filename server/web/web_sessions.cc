#include "server/web/web_sessions.h"

#include <openssl/rand.h>

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fitrun::server {
namespace {

constexpr int kIdBytes = 32;  // 256 bits

constexpr char kNoCredential[] =
    "fitrund requires a credential here: send 'Authorization: Bearer <token>', or sign in on the page "
    "(POST /api/session with the token) for a session cookie";
constexpr char kSessionEnded[] =
    "the session has ended (it expired, was signed out, or its token was removed): sign in again";
constexpr char kUnknownToken[] = "the token is not one fitrund knows";

bool IsSessionId(absl::string_view text) {
  return text.size() == 2 * kIdBytes && text.find_first_not_of("0123456789abcdef") == absl::string_view::npos;
}

}  // namespace

WebSessions::WebSessions(Options options, const Authenticator* authenticator)
    : options_(std::move(options)), authenticator_(authenticator) {}

absl::StatusOr<Caller> WebSessions::Identify(const WebCredentials& credentials) {
  if (!secured()) return Caller{"local", true};
  if (!credentials.bearer_token.empty()) {
    absl::StatusOr<Caller> caller = authenticator_->Identify(credentials.bearer_token, "");
    if (!caller.ok()) return absl::UnauthenticatedError(kUnknownToken);
    return caller;
  }
  if (!credentials.certificate_name.empty()) {
    absl::StatusOr<Caller> caller = authenticator_->Identify("", credentials.certificate_name);
    if (caller.ok()) return caller;
  }
  bool session_ended = false;
  if (!credentials.session_id.empty()) {
    const std::string key = Authenticator::Sha256Hex(credentials.session_id);
    Session session;
    bool found = false;
    {
      absl::MutexLock lock(&mu_);
      SweepLocked(options_.clock());
      if (auto it = sessions_.find(key); it != sessions_.end()) {
        session = it->second;
        found = true;
      }
    }
    if (found) {
      absl::StatusOr<Caller> caller = authenticator_->IdentifyTokenHash(session.token_hash);
      // The token still belongs to the user who signed in with it: the file as it is now decides.
      if (caller.ok() && caller->user == session.user) return caller;
      absl::MutexLock lock(&mu_);
      EraseLocked(key);
    }
    session_ended = true;
  }
  return absl::UnauthenticatedError(session_ended ? kSessionEnded : kNoCredential);
}

absl::StatusOr<std::optional<Caller>> WebSessions::MayScrape(const WebCredentials& credentials) {
  absl::StatusOr<Caller> caller = Identify(credentials);
  if (caller.ok()) return std::optional<Caller>(*caller);
  if (options_.metrics_public) return std::optional<Caller>();
  return absl::UnauthenticatedError(absl::StrCat(
      caller.status().message(), ". Prometheus: a scrape config with authorization: {type: Bearer, "
                                 "credentials_file: ...} holding the token of a user in --auth_tokens"));
}

absl::StatusOr<WebSessions::NewSession> WebSessions::StartSession(const std::string& token) {
  if (!secured()) return NewSession{"", Caller{"local", true}, absl::InfiniteFuture()};
  if (token.empty()) return absl::InvalidArgumentError("token: give the token fitrund's operator gave you");
  absl::StatusOr<Caller> caller = authenticator_->Identify(token, "");
  if (!caller.ok()) return absl::UnauthenticatedError(kUnknownToken);
  unsigned char random[kIdBytes];
  if (RAND_bytes(random, sizeof(random)) != 1) {
    return absl::InternalError("the random number generator failed: no session was started");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (const unsigned char byte : random) {
    id.push_back(kHex[byte >> 4]);
    id.push_back(kHex[byte & 0xf]);
  }
  const absl::Time now = options_.clock();
  NewSession started{id, *caller, now + options_.lifetime};
  const std::string key = Authenticator::Sha256Hex(id);
  absl::MutexLock lock(&mu_);
  SweepLocked(now);
  // The user's own oldest first, then anyone's: one user signing in again and again pushes out
  // only their own sessions.
  std::vector<std::string> own;  // oldest first
  for (const auto& [age, key] : by_age_) {
    if (sessions_.at(key).user == caller->user) own.push_back(key);
  }
  for (size_t i = 0; i + options_.max_sessions_per_user <= own.size(); ++i) EraseLocked(own[i]);
  while (!by_age_.empty() && static_cast<int>(sessions_.size()) >= options_.max_sessions) {
    EraseLocked(by_age_.begin()->second);
  }
  const uint64_t age = next_age_++;
  sessions_[key] = Session{Authenticator::Sha256Hex(token), caller->user, started.expires, age};
  by_age_[age] = key;
  return started;
}

void WebSessions::EndSession(const std::string& session_id) {
  if (session_id.empty()) return;
  absl::MutexLock lock(&mu_);
  EraseLocked(Authenticator::Sha256Hex(session_id));
}

int WebSessions::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

void WebSessions::SweepLocked(absl::Time now) {
  while (!by_age_.empty()) {
    auto it = sessions_.find(by_age_.begin()->second);
    if (it != sessions_.end() && it->second.expires > now) return;
    EraseLocked(by_age_.begin()->second);
  }
}

void WebSessions::EraseLocked(const std::string& key) {
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return;
  by_age_.erase(it->second.age);
  sessions_.erase(it);
}

std::string WebSessions::BearerToken(absl::string_view authorization_header) {
  absl::string_view value = absl::StripAsciiWhitespace(authorization_header);
  if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) return "";
  return std::string(absl::StripAsciiWhitespace(value.substr(7)));
}

std::string WebSessions::SessionCookie(absl::string_view cookie_header) {
  for (absl::string_view pair : absl::StrSplit(cookie_header, ';')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (absl::StripAsciiWhitespace(kv.first) != kCookieName) continue;
    const absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (IsSessionId(value)) return std::string(value);
  }
  return "";
}

std::string WebSessions::SessionCookieHeader(const std::string& session_id, bool secure) const {
  return absl::StrCat(kCookieName, "=", session_id, "; Path=/; Max-Age=", absl::ToInt64Seconds(options_.lifetime),
                      "; HttpOnly; SameSite=Strict", secure ? "; Secure" : "");
}

std::string WebSessions::ClearedCookieHeader(bool secure) {
  return absl::StrCat(kCookieName, "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict", secure ? "; Secure" : "");
}

}  // namespace fitrun::server
