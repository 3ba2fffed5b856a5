#include "support/test_ca.hpp"

#include "support/host_inspect.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace moat::test {
namespace {

// Run by /bin/sh in the directory given as $1; every step's output goes to gen.log.
constexpr const char* generate_script = R"(set -e
cd "$1"
exec >gen.log 2>&1
cat > ext.cnf <<X
[server]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
[wrong]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:wrong.example
X
for ca in ca unknown_ca; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $ca.key \
    -out $ca.pem -days 2 -subj "/CN=moat test $ca" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
done
issue() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $1.key \
    -out $1.csr -subj "/CN=moat test $1"
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem -days 2 \
    -extfile ext.cnf -extensions $3
}
issue server ca server
issue wrong_host ca wrong
issue untrusted unknown_ca server
chmod 600 *.key
)";

}  // namespace

test_ca::test_ca() {
    char dir_template[] = "/tmp/moat-test-ca-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    dir = dir_template;
    const std::string script = dir + "/gen.sh";
    {
        std::ofstream out(script);
        out << generate_script;
    }
    const std::string command = "/bin/sh " + script + " " + dir;
    const int status = std::system(command.c_str());
    if (status != 0) FAIL("generating test certificates failed: " << read_file(dir + "/gen.log"));
    ca_file = dir + "/ca.pem";
    server_cert_file = dir + "/server.pem";
    server_key_file = dir + "/server.key";
    wrong_host_cert_file = dir + "/wrong_host.pem";
    wrong_host_key_file = dir + "/wrong_host.key";
    unknown_ca_file = dir + "/unknown_ca.pem";
    untrusted_cert_file = dir + "/untrusted.pem";
    untrusted_key_file = dir + "/untrusted.key";
}

test_ca::~test_ca() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
}

}  // namespace moat::test
