#include "http/stream.h"

namespace waystone::http_stream {

absl::StatusOr<std::unique_ptr<net::ssl::context>> TlsContext(const std::string& cert_file,
                                                              const std::string& key_file) {
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate file and a key file");
  }
  auto context = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
  context->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                       net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                       net::ssl::context::no_tlsv1_1);
  // TLS 1.2's suites: forward secrecy (ECDHE) and AEAD only, no static RSA key exchange
  // and no CBC (Mozilla's "intermediate" list without DHE); TLS 1.3's are all AEAD.
  if (SSL_CTX_set_cipher_list(context->native_handle(),
                              "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                              "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                              "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305") != 1) {
    return absl::InternalError("OpenSSL refused the TLS 1.2 cipher list");
  }
  error_code ec;
  context->use_certificate_chain_file(cert_file, ec);
  if (ec) {
    return absl::InvalidArgumentError("TLS certificate file '" + cert_file +
                                      "' cannot be used: " + ec.message());
  }
  context->use_private_key_file(key_file, net::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError("TLS key file '" + key_file +
                                      "' cannot be used: " + ec.message());
  }
  if (SSL_CTX_check_private_key(context->native_handle()) != 1) {
    return absl::InvalidArgumentError("TLS key file '" + key_file +
                                      "' does not belong to the certificate in '" + cert_file +
                                      "'");
  }
  return context;
}

}  // namespace waystone::http_stream
