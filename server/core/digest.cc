#include "server/core/digest.h"

#include <openssl/sha.h>

#include "absl/strings/escaping.h"

namespace fitrun::server {

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

}  // namespace fitrun::server
