#include "http/tls.hpp"

#include <asio/ip/address.hpp>
#include <asio/ssl/error.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fstream>

namespace moat::http {
namespace {

constexpr auto context_options = asio::ssl::context::default_workarounds |
                                 asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 |
                                 asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1 |
                                 asio::ssl::context::single_dh_use;

bool is_readable(const std::string& path) {
    std::ifstream in(path);
    return in.good();
}

std::shared_ptr<asio::ssl::context> new_context(asio::ssl::context::method method) {
    auto context = std::make_shared<asio::ssl::context>(method);
    std::error_code ignored;
    context->set_options(context_options, ignored);
    SSL_CTX_set_min_proto_version(context->native_handle(), TLS1_2_VERSION);
    return context;
}

}  // namespace

result<std::shared_ptr<asio::ssl::context>> make_client_context(const tls_client_options& options) {
    std::shared_ptr<asio::ssl::context> context;
    try {
        context = new_context(asio::ssl::context::tls_client);
    } catch (const std::exception& e) {
        return make_error(errc::backend_failure, std::string("TLS client context: ") + e.what());
    }
    std::error_code ec;
    if (options.use_system_store) {
        context->set_default_verify_paths(ec);
        if (ec)
            return make_error(errc::backend_failure, "TLS: the system CA store: " + ec.message());
    }
    if (!options.ca_file.empty()) {
        if (!is_readable(options.ca_file)) {
            return make_error(errc::invalid_argument,
                              "TLS CA file " + options.ca_file + ": cannot be read");
        }
        context->load_verify_file(options.ca_file, ec);
        if (ec) {
            return make_error(errc::invalid_argument,
                              "TLS CA file " + options.ca_file + ": no usable certificate");
        }
    }
    context->set_verify_mode(asio::ssl::verify_peer, ec);
    if (ec) return make_error(errc::backend_failure, "TLS verify mode: " + ec.message());
    return context;
}

result<std::shared_ptr<asio::ssl::context>> make_server_context(const std::string& certificate_file,
                                                                const std::string& key_file) {
    std::shared_ptr<asio::ssl::context> context;
    try {
        context = new_context(asio::ssl::context::tls_server);
    } catch (const std::exception& e) {
        return make_error(errc::backend_failure, std::string("TLS server context: ") + e.what());
    }
    for (const auto* file : {&certificate_file, &key_file}) {
        if (!is_readable(*file)) {
            return make_error(errc::invalid_argument, "TLS file " + *file + ": cannot be read");
        }
    }
    std::error_code ec;
    context->use_certificate_chain_file(certificate_file, ec);
    if (ec) {
        return make_error(errc::invalid_argument,
                          "TLS certificate " + certificate_file + ": not a PEM certificate chain");
    }
    // The key's bytes never reach an error: only the file's name does.
    context->use_private_key_file(key_file, asio::ssl::context::pem, ec);
    if (ec && ec.category() == asio::error::get_ssl_category() &&
        ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH) {
        return make_error(errc::invalid_argument,
                          "TLS key " + key_file + ": does not match " + certificate_file);
    }
    if (ec) {
        return make_error(errc::invalid_argument,
                          "TLS key " + key_file + ": not a PEM private key");
    }
    if (SSL_CTX_check_private_key(context->native_handle()) != 1) {
        ERR_clear_error();
        return make_error(errc::invalid_argument,
                          "TLS key " + key_file + ": does not match " + certificate_file);
    }
    return context;
}

result<void> prepare_client_stream(tls_stream& stream, std::string_view host) {
    if (host.empty()) return make_error(errc::invalid_argument, "TLS: no host name to verify");
    SSL* ssl = stream.native_handle();
    const std::string name(host);
    std::error_code ec;
    (void)asio::ip::make_address(name, ec);
    if (!ec) {
        // An IP literal: no SNI (RFC 6066), the certificate must list the address.
        X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
        if (X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) != 1) {
            return make_error(errc::invalid_argument, "TLS: cannot verify address " + name);
        }
    } else {
        // SSL_set_tlsext_host_name, without the macro's C cast.
        if (SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                     const_cast<char*>(name.c_str())) != 1 ||
            SSL_set1_host(ssl, name.c_str()) != 1) {
            ERR_clear_error();
            return make_error(errc::invalid_argument, "TLS: cannot verify host name " + name);
        }
        SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    }
    stream.set_verify_mode(asio::ssl::verify_peer, ec);
    if (ec) return make_error(errc::backend_failure, "TLS verify mode: " + ec.message());
    return {};
}

std::string describe_handshake_failure(tls_stream& stream, const std::error_code& ec) {
    const long verify = SSL_get_verify_result(stream.native_handle());
    ERR_clear_error();
    switch (verify) {
        case X509_V_OK:
            break;
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
        case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
        case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
            return "certificate verify failed: unknown CA";
        case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
            return "certificate verify failed: self-signed certificate";
        case X509_V_ERR_HOSTNAME_MISMATCH:
        case X509_V_ERR_IP_ADDRESS_MISMATCH:
            return "certificate verify failed: host name mismatch";
        case X509_V_ERR_CERT_HAS_EXPIRED:
            return "certificate verify failed: expired";
        case X509_V_ERR_CERT_NOT_YET_VALID:
            return "certificate verify failed: not yet valid";
        default:
            return std::string("certificate verify failed: ") +
                   X509_verify_cert_error_string(verify);
    }
    if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
        return "the peer closed the connection during the handshake";
    }
    if (ec.category() == asio::error::get_ssl_category()) {
        // OpenSSL's reason string, e.g. "wrong version number".
        const char* reason = ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
        if (reason != nullptr) return reason;
    }
    return ec.message();
}

}  // namespace moat::http
