#include "server/auth/authenticator.h"

#include <openssl/evp.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fitrun::server {

std::string Authenticator::Sha256Hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(Options options) {
  std::unique_ptr<Authenticator> authenticator(new Authenticator(std::move(options)));
  if (absl::Status s = authenticator->Reload(); !s.ok()) return s;
  return authenticator;
}

absl::Status Authenticator::Reload() {
  if (options_.tokens_file.empty()) return absl::OkStatus();
  std::ifstream in(options_.tokens_file);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("--auth_tokens: cannot read ", options_.tokens_file));
  std::map<std::string, Entry> by_hash;
  std::map<std::string, Entry> users;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string content(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (content.empty()) continue;
    const std::vector<std::string> fields = absl::StrSplit(content, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("--auth_tokens: ", options_.tokens_file, " line ", number, ": ");
    if (fields.size() != 3 && fields.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected '<user> <admin|user> <sha256 hex of the token> [<unix account>]'"));
    }
    if (fields[1] != "admin" && fields[1] != "user") {
      return absl::InvalidArgumentError(absl::StrCat(where, "the role is admin or user (got '", fields[1], "')"));
    }
    const bool admin = fields[1] == "admin";
    std::string account = fields.size() == 4 ? (fields[3] == "=" ? fields[0] : fields[3]) : "";
    Entry& user = users[fields[0]];
    user.user = fields[0];
    user.admin = user.admin || admin;
    if (!account.empty()) {
      if (!user.unix_account.empty() && user.unix_account != account) {
        return absl::InvalidArgumentError(absl::StrCat(where, "user ", fields[0], " already runs jobs as Unix account ",
                                                       user.unix_account, "; one account per user"));
      }
      user.unix_account = account;
    }
    if (fields[2] == "-") continue;  // a certificate user's role only
    const std::string hash = absl::AsciiStrToLower(fields[2]);
    if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the third field is the token's SHA-256 in hex (64 digits), "
                                                            "never the token: printf '%s' \"$TOKEN\" | sha256sum | cut -d' ' -f1"));
    }
    by_hash[hash] = {fields[0], admin, ""};
  }
  absl::MutexLock lock(&mu_);
  by_hash_ = std::move(by_hash);
  users_ = std::move(users);
  return absl::OkStatus();
}

std::string Authenticator::AccountOf(const std::string& user, const std::string& listed) const {
  if (!listed.empty()) return listed;
  return options_.same_name_accounts ? user : "";
}

absl::StatusOr<Caller> Authenticator::Identify(const std::string& bearer_token,
                                               const std::string& certificate_name) const {
  if (!secured_) return Caller{"local", true};
  absl::MutexLock lock(&mu_);
  if (!bearer_token.empty()) {
    std::optional<Caller> caller = CallerOfTokenHashLocked(Sha256Hex(bearer_token));
    if (!caller.has_value()) return absl::UnauthenticatedError("the bearer token is not one fitrund knows");
    return *std::move(caller);
  }
  if (options_.client_certificates && !certificate_name.empty()) {
    auto it = users_.find(certificate_name);
    const bool listed = it != users_.end();
    return Caller{certificate_name, listed && it->second.admin,
                  AccountOf(certificate_name, listed ? it->second.unix_account : "")};
  }
  return absl::UnauthenticatedError(
      "fitrund requires a credential: a bearer token (fitrun --token, FITRUN_TOKEN) or a client certificate");
}

absl::StatusOr<Caller> Authenticator::IdentifyTokenHash(const std::string& token_hash) const {
  if (!secured_) return Caller{"local", true};
  absl::MutexLock lock(&mu_);
  std::optional<Caller> caller = CallerOfTokenHashLocked(token_hash);
  if (!caller.has_value()) return absl::UnauthenticatedError("the token is not one fitrund knows");
  return *std::move(caller);
}

std::optional<Caller> Authenticator::CallerOfTokenHashLocked(const std::string& token_hash) const {
  auto it = by_hash_.find(token_hash);
  if (it == by_hash_.end()) return std::nullopt;
  const std::string& user = it->second.user;
  auto listed = users_.find(user);
  return Caller{user, it->second.admin, AccountOf(user, listed != users_.end() ? listed->second.unix_account : "")};
}

}  // namespace fitrun::server
