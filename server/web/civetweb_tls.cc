#include "server/web/civetweb_tls.h"

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/contract/install_layout.h"

namespace fitrun::server {
namespace {

constexpr char kShimName[] = "libfitrun-civetweb-ssl.so";

// The last OpenSSL error, as text ("" when none).
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::Status LoadShim() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  // Under fitrund's layout root (proto/contract/install_layout.h: bazel-bin/server/web/ for Bazel's
  // fitrund, /usr/lib/fitrun/server/web/ for the package's), or beside fitrund (tools/bundle.sh's bin/).
  std::vector<std::filesystem::path> candidates;
  for (const std::string& root : fitrun::contract::layout::RootsOf(self.string(), /*from_worker=*/false)) {
    candidates.push_back(std::filesystem::path(root) / fitrun::contract::layout::kCivetwebSslShim);
  }
  candidates.push_back(self.parent_path() / kShimName);
  std::vector<std::string> tried;
  for (const std::filesystem::path& candidate : candidates) {
    if (!std::filesystem::exists(candidate, error)) {
      tried.push_back(candidate.string());
      continue;
    }
    // Kept loaded for the life of the process: civetweb holds pointers into it.
    if (dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL) != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("TLS on --metrics_listen: cannot load ", candidate.string(), ": ",
                                                      dlerror()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "TLS on --metrics_listen needs ", kShimName, " beside fitrund (looked in ", absl::StrJoin(tried, ", "),
      "): install it with fitrund and fitrun-worker"));
}

}  // namespace

absl::Status PrepareCivetwebForOpenSsl3() {
  static absl::once_flag once;
  static absl::Status* loaded = nullptr;
  absl::call_once(once, [] { loaded = new absl::Status(LoadShim()); });
  return *loaded;
}

absl::Status ConfigureTlsContext(void* ssl_context, const WebTls& tls) {
  SSL_CTX* context = static_cast<SSL_CTX*>(ssl_context);
  ERR_clear_error();
  if (SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION) != 1) {
    return absl::InternalError(absl::StrCat("TLS on --metrics_listen: ", OpenSslError()));
  }
  if (SSL_CTX_use_certificate_chain_file(context, tls.cert.c_str()) != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tls_cert: cannot use ", tls.cert, " on --metrics_listen: ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(context, tls.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(context) != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tls_key: cannot use ", tls.key, " with --tls_cert on --metrics_listen: ", OpenSslError()));
  }
  if (!tls.client_ca.empty()) {
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca.c_str());
    if (names == nullptr || SSL_CTX_load_verify_locations(context, tls.client_ca.c_str(), nullptr) != 1) {
      if (names != nullptr) sk_X509_NAME_pop_free(names, X509_NAME_free);
      return absl::FailedPreconditionError(
          absl::StrCat("--tls_client_ca: cannot use ", tls.client_ca, " on --metrics_listen: ", OpenSslError()));
    }
    SSL_CTX_set_client_CA_list(context, names);
    // Asked for, not required: browsers and Prometheus with tokens connect without one. One that is
    // presented must verify, or the handshake fails.
    SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nullptr);
  }
  return absl::OkStatus();
}

std::string CertificateCommonName(const void* peer_certificate) {
  if (peer_certificate == nullptr) return "";
  X509_NAME* subject = X509_get_subject_name(static_cast<const X509*>(peer_certificate));
  if (subject == nullptr) return "";
  const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (index < 0) return "";
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
  unsigned char* utf8 = nullptr;
  const int length = ASN1_STRING_to_UTF8(&utf8, data);
  if (length < 0) return "";
  std::string name(reinterpret_cast<const char*>(utf8), static_cast<size_t>(length));
  OPENSSL_free(utf8);
  // A name with an embedded NUL is not one a user file can hold.
  return name.find('\0') == std::string::npos ? name : "";
}

}  // namespace fitrun::server
