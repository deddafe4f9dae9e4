// libfitrun-civetweb-ssl.so: the one OpenSSL 1.1 function Debian 12's civetweb (1.15) asks OpenSSL 3
// for and no longer finds.
//
// civetweb was built for OpenSSL 1.1's API and loads it at run time: dlopen("libssl.so"), then one
// dlsym per function. OpenSSL 3 renamed SSL_get_peer_certificate to SSL_get1_peer_certificate (the
// old name is a macro now), so civetweb's pointer to it is null and the first HTTPS request crashes.
// This library's soname is "libssl.so" and it depends on libssl.so.3: once fitrund has loaded it,
// civetweb's dlopen("libssl.so") finds it already loaded (the loader matches on the soname), and each
// dlsym searches it first, then libssl.so.3 beneath it. So civetweb gets OpenSSL 3 whole, with the
// old name answering as the new one. Both names take a reference the caller frees (X509_free), as
// civetweb does.
#include <openssl/ssl.h>

#undef SSL_get_peer_certificate

extern "C" __attribute__((visibility("default"))) X509* SSL_get_peer_certificate(const SSL* ssl) {
  return SSL_get1_peer_certificate(ssl);
}
