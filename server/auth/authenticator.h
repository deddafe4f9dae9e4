// Who is calling fitrund, and what they may see. Plain C++: the gRPC service hands it what the
// transport carried (a bearer token, the client certificate's verified common name) and gets a
// Caller or UNAUTHENTICATED.
//
// Modes. Local (no token file, no client CA): every caller is the single user "local", an admin;
// that is the default on loopback, where the demo runs. Secured (a token file, or mutual TLS): a
// caller is who their bearer token or client certificate says, and nobody else gets in.
//
// The token file (--auth_tokens) has one line per token: `<user> <admin|user> <sha256 hex of the
// token> [<unix account>]` (# starts a comment). It never holds a token itself: make a line with
//   printf '%s' "$TOKEN" | sha256sum
// A user of the file without tokens can still be named, for a client certificate's common name to
// get a role (and an account): `<user> admin -`. The optional fourth field is the Unix account the
// user's jobs run as when fitrund is root (`=`: the account named like the user); a user without
// one gets the account named like them when Options::same_name_accounts says so, else none. Reload() rereads it (fitrund does on SIGHUP); a file that fails to
// parse leaves the previous one in force. Thread-safe.
#ifndef FITRUN_SERVER_AUTH_AUTHENTICATOR_H_
#define FITRUN_SERVER_AUTH_AUTHENTICATOR_H_

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace fitrun::server {

struct Caller {
  std::string user;
  bool admin = false;
  // The Unix account the caller's jobs run as (fitrund as root); empty: none is known.
  std::string unix_account;

  // Whether the caller may see and act on a job `owner` submitted. Jobs stored before owners
  // existed have none and are the admins'.
  bool MayAccess(const std::string& owner) const { return admin || (!owner.empty() && owner == user); }
};

class Authenticator {
 public:
  struct Options {
    std::string tokens_file;       // empty: no tokens
    bool client_certificates = false;  // mutual TLS: a verified client certificate identifies its holder
    // A user the file gives no account runs jobs as the account named like them (--unix_accounts=same_name).
    bool same_name_accounts = false;
  };
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(Options options);

  bool secured() const { return secured_; }
  // `bearer_token`: the token after "Bearer " in the authorization header ("" if none);
  // `certificate_name`: the verified client certificate's common name ("" if none).
  absl::StatusOr<Caller> Identify(const std::string& bearer_token, const std::string& certificate_name) const;
  absl::Status Reload();

  // Lowercase hex SHA-256, as the token file holds it.
  static std::string Sha256Hex(const std::string& text);
  // The user whose token hashes to `token_hash` (Sha256Hex) in the file as it is now: what a web
  // session, which keeps the hash and never the token, checks on each request, so that a token
  // Reload() no longer finds ends its sessions. Local mode: the local admin.
  absl::StatusOr<Caller> IdentifyTokenHash(const std::string& token_hash) const;

 private:
  struct Entry {
    std::string user;
    bool admin = false;
    std::string unix_account;
  };
  // The user's account: the file's, or the same-name rule's.
  std::string AccountOf(const std::string& user, const std::string& listed) const;
  // The caller whose token hashes to `token_hash`, if the file has it.
  std::optional<Caller> CallerOfTokenHashLocked(const std::string& token_hash) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  explicit Authenticator(Options options)
      : options_(std::move(options)), secured_(!options_.tokens_file.empty() || options_.client_certificates) {}

  const Options options_;
  const bool secured_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> by_hash_ ABSL_GUARDED_BY(mu_);
  // Per user named in the file: admin or not, and the account its lines give (if any).
  std::map<std::string, Entry> users_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_AUTH_AUTHENTICATOR_H_
