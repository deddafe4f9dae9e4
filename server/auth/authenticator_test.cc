#include "server/auth/authenticator.h"

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

class AuthenticatorTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  // Writes `text` to the file `name` of the test's own directory (again: replaces it) and names it.
  std::string WriteTokens(const std::string& name, const std::string& text) {
    const std::string path = dir_.Join(name);
    std::ofstream(path) << text;
    return path;
  }

  TempDir dir_;
};

TEST_F(AuthenticatorTest, LocalModeMakesEveryCallerTheLocalAdmin) {
  auto local = Authenticator::Create({});
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE((*local)->secured());
  absl::StatusOr<Caller> caller = (*local)->Identify("", "");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->user, "local");
  EXPECT_TRUE(caller->admin);
}

TEST_F(AuthenticatorTest, TokensAreKnownByTheirHashAndGiveTheirUsersRole) {
  // sha256("alice-secret") and sha256("root-secret"), as `printf '%s' ... | sha256sum` prints them.
  const std::string alice = Authenticator::Sha256Hex("alice-secret");
  const std::string root = Authenticator::Sha256Hex("root-secret");
  EXPECT_EQ(Authenticator::Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string path = WriteTokens("tokens", "# who\nalice user " + alice + "\nroot  admin " + root + "  # ops\n");
  auto auth = Authenticator::Create({path, false});
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE((*auth)->secured());
  EXPECT_EQ((*auth)->Identify("alice-secret", "")->user, "alice");
  EXPECT_FALSE((*auth)->Identify("alice-secret", "")->admin);
  EXPECT_TRUE((*auth)->Identify("root-secret", "")->admin);
  EXPECT_EQ((*auth)->Identify("guess", "").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT((*auth)->Identify("", "").status().message(), HasSubstr("requires a credential"));
  // Without mutual TLS a certificate name means nothing.
  EXPECT_EQ((*auth)->Identify("", "alice").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthenticatorTest, ClientCertificatesNameTheirHolderWithTheRoleTheFileGives) {
  const std::string path = WriteTokens("cert_roles", "ops admin -\n");
  auto auth = Authenticator::Create({path, true});
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->Identify("", "bob")->user, "bob");
  EXPECT_FALSE((*auth)->Identify("", "bob")->admin);
  EXPECT_TRUE((*auth)->Identify("", "ops")->admin);
  auto certificates_only = Authenticator::Create({"", true});
  ASSERT_TRUE(certificates_only.ok());
  EXPECT_EQ((*certificates_only)->Identify("", "").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthenticatorTest, ReloadTakesANewFileAndKeepsTheOldOneWhenTheNewOneIsBroken) {
  const std::string path = WriteTokens("reload", "alice user " + Authenticator::Sha256Hex("one") + "\n");
  auto auth = Authenticator::Create({path, false});
  ASSERT_TRUE(auth.ok());
  WriteTokens("reload", "alice user " + Authenticator::Sha256Hex("two") + "\n");
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_FALSE((*auth)->Identify("one", "").ok());
  EXPECT_TRUE((*auth)->Identify("two", "").ok());
  WriteTokens("reload", "alice user two\n");  // the token itself, not its hash
  EXPECT_THAT((*auth)->Reload().message(), HasSubstr("never the token"));
  EXPECT_TRUE((*auth)->Identify("two", "").ok());
  WriteTokens("reload", "alice superuser " + Authenticator::Sha256Hex("x") + "\n");
  EXPECT_THAT((*auth)->Reload().message(), HasSubstr("line 1: the role is admin or user"));
}

TEST_F(AuthenticatorTest, ATokensHashIdentifiesItsUserForAsLongAsTheFileHasIt) {
  const std::string path = WriteTokens("by_hash", "alice user " + Authenticator::Sha256Hex("a") + " =\n" +
                                                      "root admin " + Authenticator::Sha256Hex("r") + "\n");
  auto auth = Authenticator::Create({path, false});
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->IdentifyTokenHash(Authenticator::Sha256Hex("a"))->user, "alice");
  // The same caller as the token itself gives, account included.
  EXPECT_EQ((*auth)->IdentifyTokenHash(Authenticator::Sha256Hex("a"))->unix_account, "alice");
  EXPECT_EQ((*auth)->Identify("a", "")->unix_account, "alice");
  EXPECT_FALSE((*auth)->IdentifyTokenHash(Authenticator::Sha256Hex("a"))->admin);
  EXPECT_TRUE((*auth)->IdentifyTokenHash(Authenticator::Sha256Hex("r"))->admin);
  EXPECT_EQ((*auth)->IdentifyTokenHash("a").status().code(), absl::StatusCode::kUnauthenticated);
  WriteTokens("by_hash", "root admin " + Authenticator::Sha256Hex("r") + "\n");
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_EQ((*auth)->IdentifyTokenHash(Authenticator::Sha256Hex("a")).status().code(),
            absl::StatusCode::kUnauthenticated);
  auto local = Authenticator::Create({});
  ASSERT_TRUE(local.ok());
  EXPECT_EQ((*local)->IdentifyTokenHash("")->user, "local");
}

TEST(CallerTest, UsersSeeTheirOwnJobsAndAdminsEveryJob) {
  EXPECT_TRUE((Caller{"alice", false}).MayAccess("alice"));
  EXPECT_FALSE((Caller{"alice", false}).MayAccess("bob"));
  EXPECT_FALSE((Caller{"alice", false}).MayAccess(""));
  EXPECT_TRUE((Caller{"root", true}).MayAccess("bob"));
}

TEST_F(AuthenticatorTest, UsersCarryTheUnixAccountTheirJobsRunAs) {
  const std::string path = WriteTokens(
      "accounts", "alice user " + Authenticator::Sha256Hex("a") + " alice_unix\n" +  //
                      "bob user " + Authenticator::Sha256Hex("b") + " =\n" +            //
                      "carol user " + Authenticator::Sha256Hex("c") + "\n" +            //
                      "dave admin - dave_unix\n");
  auto listed = Authenticator::Create({path, true});
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ((*listed)->Identify("a", "")->unix_account, "alice_unix");
  EXPECT_EQ((*listed)->Identify("b", "")->unix_account, "bob");  // `=`: the account named like the user
  EXPECT_EQ((*listed)->Identify("c", "")->unix_account, "");     // none: such a user's jobs are refused as root
  EXPECT_EQ((*listed)->Identify("", "dave")->unix_account, "dave_unix");
  EXPECT_EQ((*listed)->Identify("", "erin")->unix_account, "");

  Authenticator::Options same_name{path, true};
  same_name.same_name_accounts = true;
  auto by_rule = Authenticator::Create(same_name);
  ASSERT_TRUE(by_rule.ok()) << by_rule.status();
  EXPECT_EQ((*by_rule)->Identify("a", "")->unix_account, "alice_unix");  // the file's account wins
  EXPECT_EQ((*by_rule)->Identify("c", "")->unix_account, "carol");
  EXPECT_EQ((*by_rule)->Identify("", "erin")->unix_account, "erin");
}

TEST_F(AuthenticatorTest, TwoAccountsForOneUserAreRefusedNamingTheLine) {
  const std::string path = WriteTokens("two-accounts", "alice user " + Authenticator::Sha256Hex("a") + " one\n" +
                                                           "alice user " + Authenticator::Sha256Hex("b") + " two\n");
  auto auth = Authenticator::Create({path, false});
  ASSERT_FALSE(auth.ok());
  EXPECT_THAT(auth.status().message(), HasSubstr("line 2: user alice already runs jobs as Unix account one"));
}

}  // namespace
}  // namespace fitrun::server
