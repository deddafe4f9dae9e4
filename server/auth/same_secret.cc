#include "server/auth/same_secret.h"

#include <algorithm>

namespace fitrun::server {

bool SameSecret(const std::string& given, const std::string& secret) {
  // Every byte of the longer is looked at, whatever differs first.
  const size_t n = std::max(given.size(), secret.size());
  unsigned char differ = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    const unsigned char b = i < secret.size() ? static_cast<unsigned char>(secret[i]) : 0;
    differ |= static_cast<unsigned char>(a ^ b);
  }
  return differ == 0 && !secret.empty();
}

}  // namespace fitrun::server
