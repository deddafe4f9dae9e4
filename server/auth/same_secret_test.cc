#include "server/auth/same_secret.h"

#include <gtest/gtest.h>

namespace fitrun::server {
namespace {

TEST(SameSecretTest, ComparesWholeSecretsOnly) {
  EXPECT_TRUE(SameSecret("0123abcd", "0123abcd"));
  EXPECT_FALSE(SameSecret("0123abce", "0123abcd"));
  EXPECT_FALSE(SameSecret("0123abc", "0123abcd"));
  EXPECT_FALSE(SameSecret("0123abcd0", "0123abcd"));
  EXPECT_FALSE(SameSecret("", ""));
  EXPECT_FALSE(SameSecret("x", ""));
}

}  // namespace
}  // namespace fitrun::server
