// Certificates for TLS tests, generated per test run into a temporary directory with the openssl
// command line (OpenSSL 3, EC P-256, valid two days):
//
//   ca_file                          a CA the test trusts (e2b_config::ca_file)
//   server_cert_file / server_key    signed by that CA for IP 127.0.0.1 and DNS localhost
//   wrong_host_cert_file / ..._key   signed by that CA for wrong.example only (host name check)
//   unknown_ca_file                  a second CA that signed nothing the server shows
//   untrusted_cert_file / ..._key    signed by the unknown CA for 127.0.0.1 (chain check)
//
// The constructor fails the test if openssl fails; the destructor removes the directory.
#pragma once

#include <string>

namespace moat::test {

class test_ca {
  public:
    test_ca();
    ~test_ca();
    test_ca(const test_ca&) = delete;
    test_ca& operator=(const test_ca&) = delete;

    std::string dir;
    std::string ca_file;
    std::string server_cert_file;
    std::string server_key_file;
    std::string wrong_host_cert_file;
    std::string wrong_host_key_file;
    std::string unknown_ca_file;
    std::string untrusted_cert_file;
    std::string untrusted_key_file;
};

}  // namespace moat::test
