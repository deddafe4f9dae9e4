// TLS on the metrics port: what civetweb (Debian 12's 1.15, built for OpenSSL 1.1) needs to serve it
// with the system's OpenSSL 3, and the TLS context fitrund sets up for it from the same certificate
// flags as the gRPC port (--tls_cert, --tls_key, --tls_client_ca).
#ifndef FITRUN_SERVER_WEB_CIVETWEB_TLS_H_
#define FITRUN_SERVER_WEB_CIVETWEB_TLS_H_

#include <string>

#include "absl/status/status.h"

namespace fitrun::server {

struct WebTls {
  std::string cert;       // PEM certificate chain (--tls_cert)
  std::string key;        // its PEM private key (--tls_key)
  std::string client_ca;  // PEM CA whose client certificates name their holders ("": none asked for)
};

// Loads libfitrun-civetweb-ssl.so (civetweb_ssl_shim.cc says why), found beside the running binary
// or in Bazel's output tree, before civetweb loads OpenSSL. Idempotent; FAILED_PRECONDITION naming
// the paths it looked in when it is not there.
absl::Status PrepareCivetwebForOpenSsl3();

// civetweb's init_ssl step: the certificate chain and key into `ssl_context` (an SSL_CTX*), TLS 1.2
// at least, and with a client CA, client certificates asked for (not required: tokens still work)
// and verified, so a handshake with one that does not verify fails. An error names the flag.
absl::Status ConfigureTlsContext(void* ssl_context, const WebTls& tls);

// The common name of a client certificate the handshake verified (`peer_certificate`: civetweb's
// request_info->client_cert->peer_cert, an X509*), or "" when it has none.
std::string CertificateCommonName(const void* peer_certificate);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_WEB_CIVETWEB_TLS_H_
