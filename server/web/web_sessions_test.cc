// WebSessions against a real Authenticator over a token file in the test's temporary directory, with
// a clock the test moves: who a request is, sessions started, expired, ended, evicted and dropped
// when a reload removes their token, /metrics' rule, and the header helpers.
#include "server/web/web_sessions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <vector>
#include <string>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

std::string TokenFile(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string Line(const std::string& user, const std::string& role, const std::string& token) {
  return user + " " + role + " " + Authenticator::Sha256Hex(token) + "\n";
}

class WebSessionsTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(Line("alice", "user", "alice-token") + Line("root", "admin", "root-token")); }

  void Start(const std::string& tokens, WebSessions::Options options = {}, bool certificates = false) {
    path_ = TokenFile("tokens", tokens);
    auto authenticator = Authenticator::Create({path_, certificates});
    ASSERT_TRUE(authenticator.ok()) << authenticator.status();
    authenticator_ = *std::move(authenticator);
    options.clock = [this] { return now_; };
    sessions_ = std::make_unique<WebSessions>(options, authenticator_.get());
  }

  WebCredentials Cookie(const std::string& id) { return WebCredentials{"", id}; }

  std::string path_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  std::unique_ptr<Authenticator> authenticator_;
  std::unique_ptr<WebSessions> sessions_;
};

TEST_F(WebSessionsTest, ABearerTokenIdentifiesItsUserAndNothingElseGetsIn) {
  EXPECT_TRUE(sessions_->secured());
  absl::StatusOr<Caller> alice = sessions_->Identify({"alice-token", ""});
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->user, "alice");
  EXPECT_FALSE(alice->admin);
  EXPECT_TRUE(sessions_->Identify({"root-token", ""})->admin);
  absl::StatusOr<Caller> nobody = sessions_->Identify({});
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(nobody.status().message(), HasSubstr("Authorization: Bearer <token>"));
  EXPECT_THAT(nobody.status().message(), HasSubstr("POST /api/session"));
  EXPECT_EQ(sessions_->Identify({"guess", ""}).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(WebSessionsTest, AVerifiedCertificateNamesItsHolderOnlyWithMutualTlsAndAWrongTokenStillFails) {
  const WebCredentials certificate{"", "", "alice"};
  // Without --tls_client_ca the Authenticator takes no certificate names.
  EXPECT_EQ(sessions_->Identify(certificate).status().code(), absl::StatusCode::kUnauthenticated);
  Start(Line("alice", "user", "alice-token") + Line("root", "admin", "root-token"), {}, /*certificates=*/true);
  absl::StatusOr<Caller> alice = sessions_->Identify(certificate);
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->user, "alice");
  EXPECT_FALSE(alice->admin);
  EXPECT_TRUE(sessions_->Identify({"", "", "root"})->admin);
  // What the client sends explicitly counts: a wrong token beside a good certificate is refused.
  EXPECT_EQ(sessions_->Identify({"guess", "", "alice"}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(sessions_->Identify({"root-token", "", "alice"})->user, "root");
}

TEST_F(WebSessionsTest, ALoginStartsASessionItsCookieIdentifies) {
  absl::StatusOr<WebSessions::NewSession> login = sessions_->StartSession("alice-token");
  ASSERT_TRUE(login.ok()) << login.status();
  EXPECT_EQ(login->caller.user, "alice");
  EXPECT_EQ(login->expires, now_ + absl::Hours(12));
  EXPECT_EQ(login->id.size(), 64u);
  EXPECT_EQ(login->id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(sessions_->size(), 1);
  absl::StatusOr<Caller> caller = sessions_->Identify(Cookie(login->id));
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->user, "alice");
  // An id nobody was given is no session.
  std::string other = login->id;
  other[0] = other[0] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(sessions_->Identify(Cookie(other)).ok());
  // A wrong bearer token beside a good cookie is refused: what is sent explicitly counts.
  EXPECT_FALSE(sessions_->Identify({"guess", login->id}).ok());
}

TEST_F(WebSessionsTest, ABadLoginSaysOnlyNoAndStartsNothing) {
  absl::StatusOr<WebSessions::NewSession> wrong = sessions_->StartSession("alice-tokeN");
  absl::StatusOr<WebSessions::NewSession> unknown = sessions_->StartSession("x");
  ASSERT_FALSE(wrong.ok());
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong.status(), unknown.status()) << "the answer must not tell wrong tokens apart";
  EXPECT_THAT(std::string(wrong.status().message()), ::testing::Not(HasSubstr("alice")));
  EXPECT_EQ(sessions_->StartSession("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sessions_->size(), 0);
}

TEST_F(WebSessionsTest, SessionsIdsAreFreshEachTime) {
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) ids.insert(sessions_->StartSession("alice-token")->id);
  EXPECT_EQ(ids.size(), 50u);
}

TEST_F(WebSessionsTest, ASessionExpiresAfterItsLifetime) {
  const std::string id = sessions_->StartSession("alice-token")->id;
  now_ += absl::Hours(12) - absl::Seconds(1);
  EXPECT_TRUE(sessions_->Identify(Cookie(id)).ok());
  now_ += absl::Seconds(1);
  absl::StatusOr<Caller> expired = sessions_->Identify(Cookie(id));
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(expired.status().message(), HasSubstr("sign in again"));
  EXPECT_EQ(sessions_->size(), 0) << "the expired session is still held";
}

TEST_F(WebSessionsTest, SigningOutEndsTheSession) {
  const std::string id = sessions_->StartSession("alice-token")->id;
  const std::string root = sessions_->StartSession("root-token")->id;
  sessions_->EndSession(id);
  sessions_->EndSession(id);  // twice is fine
  sessions_->EndSession("");
  EXPECT_FALSE(sessions_->Identify(Cookie(id)).ok());
  EXPECT_TRUE(sessions_->Identify(Cookie(root)).ok());
  EXPECT_EQ(sessions_->size(), 1);
}

TEST_F(WebSessionsTest, AReloadThatRemovesAUsersTokenEndsTheirSessionsAndAppliesNewRoles) {
  const std::string alice = sessions_->StartSession("alice-token")->id;
  const std::string root = sessions_->StartSession("root-token")->id;
  EXPECT_TRUE(sessions_->Identify(Cookie(root))->admin);
  // alice's token is gone; root is now only a user.
  TokenFile("tokens", Line("root", "user", "root-token"));
  ASSERT_TRUE(authenticator_->Reload().ok());
  EXPECT_EQ(sessions_->Identify(Cookie(alice)).status().code(), absl::StatusCode::kUnauthenticated);
  absl::StatusOr<Caller> demoted = sessions_->Identify(Cookie(root));
  ASSERT_TRUE(demoted.ok()) << demoted.status();
  EXPECT_FALSE(demoted->admin);
  EXPECT_EQ(sessions_->size(), 1);
  // The same token handed to someone else does not carry root's session over to them.
  TokenFile("tokens", Line("mallory", "user", "root-token"));
  ASSERT_TRUE(authenticator_->Reload().ok());
  EXPECT_FALSE(sessions_->Identify(Cookie(root)).ok());
}

TEST_F(WebSessionsTest, TheTableIsBoundedAndEvictsTheOldestSession) {
  WebSessions::Options options;
  options.max_sessions = 3;
  Start(Line("alice", "user", "alice-token"), options);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(sessions_->StartSession("alice-token")->id);
    now_ += absl::Seconds(1);
  }
  EXPECT_EQ(sessions_->size(), 3);
  EXPECT_FALSE(sessions_->Identify(Cookie(ids[0])).ok());
  EXPECT_FALSE(sessions_->Identify(Cookie(ids[1])).ok());
  for (int i = 2; i < 5; ++i) EXPECT_TRUE(sessions_->Identify(Cookie(ids[i])).ok()) << i;
  // Failed logins never take a place.
  for (int i = 0; i < 100; ++i) (void)sessions_->StartSession("wrong");
  EXPECT_EQ(sessions_->size(), 3);
  EXPECT_TRUE(sessions_->Identify(Cookie(ids[2])).ok());
}

TEST_F(WebSessionsTest, MutualTlsAloneIsSecuredAndOnlyItsTokenUsersGetIn) {
  // The metrics port sees no certificates: a certificate user without a token has no way in, and a
  // token in the same file still works.
  Start("ops admin -\n" + Line("alice", "user", "alice-token"), {}, /*certificates=*/true);
  EXPECT_TRUE(sessions_->secured());
  EXPECT_FALSE(sessions_->Identify({}).ok());
  EXPECT_EQ(sessions_->Identify({"alice-token", ""})->user, "alice");
}

TEST_F(WebSessionsTest, MetricsNeedAnyUserUnlessPublicAndSayWhoScrapes) {
  EXPECT_EQ(sessions_->MayScrape({}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(sessions_->MayScrape({}).status().message(), HasSubstr("credentials_file"));
  EXPECT_FALSE(sessions_->MayScrape({"guess", ""}).ok());
  absl::StatusOr<std::optional<Caller>> alice = sessions_->MayScrape({"alice-token", ""});
  ASSERT_TRUE(alice.ok() && alice->has_value());
  EXPECT_EQ((*alice)->user, "alice");
  EXPECT_TRUE(sessions_->MayScrape(Cookie(sessions_->StartSession("alice-token")->id)).ok());
  WebSessions::Options options;
  options.metrics_public = true;
  Start(Line("alice", "user", "alice-token"), options);
  absl::StatusOr<std::optional<Caller>> anyone = sessions_->MayScrape({});
  ASSERT_TRUE(anyone.ok());
  EXPECT_FALSE(anyone->has_value()) << "an anonymous scrape is nobody's: it sees no job";
  EXPECT_TRUE((*sessions_->MayScrape({"alice-token", ""}))->user == "alice") << "a user is still themselves";
  EXPECT_FALSE(sessions_->Identify({}).ok()) << "--metrics_public opens /metrics only";
}

TEST_F(WebSessionsTest, OneUserSigningInAgainAndAgainEvictsOnlyTheirOwnSessions) {
  WebSessions::Options options;
  options.max_sessions = 8;
  options.max_sessions_per_user = 3;
  Start(Line("alice", "user", "alice-token") + Line("bob", "user", "bob-token"), options);
  const std::string bobs = sessions_->StartSession("bob-token")->id;
  std::vector<std::string> alices;
  for (int i = 0; i < 20; ++i) alices.push_back(sessions_->StartSession("alice-token")->id);
  EXPECT_TRUE(sessions_->Identify(Cookie(bobs)).ok()) << "bob's session survives alice's twenty";
  EXPECT_EQ(sessions_->size(), 4);
  for (int i = 0; i < 17; ++i) EXPECT_FALSE(sessions_->Identify(Cookie(alices[i])).ok()) << i;
  for (int i = 17; i < 20; ++i) EXPECT_TRUE(sessions_->Identify(Cookie(alices[i])).ok()) << i;
}

TEST(WebSessionsLocalTest, LocalModeIsTheLocalAdminWithoutSessions) {
  auto local = Authenticator::Create({});
  ASSERT_TRUE(local.ok());
  for (const Authenticator* authenticator : std::vector<const Authenticator*>{nullptr, local->get()}) {
    WebSessions sessions({}, authenticator);
    EXPECT_FALSE(sessions.secured());
    absl::StatusOr<Caller> caller = sessions.Identify({});
    ASSERT_TRUE(caller.ok());
    EXPECT_EQ(caller->user, "local");
    EXPECT_TRUE(caller->admin);
    absl::StatusOr<std::optional<Caller>> scraper = sessions.MayScrape({});
    ASSERT_TRUE(scraper.ok() && scraper->has_value());
    EXPECT_TRUE((*scraper)->admin) << "local mode: the local admin, every job";
    absl::StatusOr<WebSessions::NewSession> login = sessions.StartSession("anything");
    ASSERT_TRUE(login.ok());
    EXPECT_TRUE(login->id.empty());
    EXPECT_EQ(sessions.size(), 0);
  }
}

TEST(WebSessionsHeadersTest, BearerTokensCookiesAndSetCookie) {
  EXPECT_EQ(WebSessions::BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(WebSessions::BearerToken("bearer  abc "), "abc");
  EXPECT_EQ(WebSessions::BearerToken("Basic YWxhZGRpbg=="), "");
  EXPECT_EQ(WebSessions::BearerToken(""), "");
  const std::string id(64, 'a');
  EXPECT_EQ(WebSessions::SessionCookie("theme=dark; fitrun_session=" + id + "; x=y"), id);
  EXPECT_EQ(WebSessions::SessionCookie("fitrun_session=" + id), id);
  EXPECT_EQ(WebSessions::SessionCookie("fitrun_session=short"), "");
  EXPECT_EQ(WebSessions::SessionCookie("other_session=" + id), "");
  EXPECT_EQ(WebSessions::SessionCookie("fitrun_session=" + std::string(64, 'G')), "");
  WebSessions sessions({}, nullptr);
  EXPECT_EQ(sessions.SessionCookieHeader(id, false),
            "fitrun_session=" + id + "; Path=/; Max-Age=43200; HttpOnly; SameSite=Strict");
  EXPECT_EQ(sessions.SessionCookieHeader(id, true),
            "fitrun_session=" + id + "; Path=/; Max-Age=43200; HttpOnly; SameSite=Strict; Secure");
  EXPECT_EQ(WebSessions::ClearedCookieHeader(false), "fitrun_session=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
}

}  // namespace
}  // namespace fitrun::server
