// Egress on the local backend, end to end: a sandbox whose network is an allow-list reaches a
// package mirror on the host's loopback through the proxy (pip download, urllib, curl, HTTPS with
// a test CA), and nothing else; a sandbox without one has no endpoint and no proxy variables;
// destroying a sandbox closes its tunnels; an attaching backend serves the proxy too.
// The e2b backend over moat serve: the network it asks for reaches the sandbox below serve,
// narrowed by the operator's and never widened; what E2B cannot express is refused.
//
// Every server here is a python3 process the test runs on 127.0.0.1 (the proxy connects from the
// host's network namespace, so the sandbox's policy names the mirror with --resolve
// pypi.test=127.0.0.1 and permits it with --allow-address 127.0.0.1/32). No traffic leaves the
// machine.
#include "support/async_wait.hpp"
#include "support/demo_wheel.hpp"
#include "support/local_fixture.hpp"
#include "support/moat_cli.hpp"
#include "support/serve_process.hpp"

#include <moat/e2b_backend.hpp>
#include <moat/local_backend.hpp>
#include <moat/log.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

// One script, four servers: `http ROOT` and `https ROOT CERT KEY` serve ROOT's files;
// `silent` accepts one connection, says "accepted", reads until EOF, says "eof"; `source` says
// "accepted" for every connection and writes zeros to it for as long as it takes them (its own
// send buffer 64 KiB). Each prints its port first.
constexpr const char* server_script = R"PY(
import functools, http.server, socket, ssl, sys, threading, time
mode = sys.argv[1]
if mode == 'source':
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    def pour(connection):
        zeros = bytes(65536)
        try:
            while True:
                connection.sendall(zeros)
        except OSError:
            pass
    while True:
        connection, _ = listener.accept()
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        print('accepted', flush=True)
        threading.Thread(target=pour, args=(connection,), daemon=True).start()
elif mode in ('http', 'https'):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    if mode == 'https':
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[3], sys.argv[4])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()
else:
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen(4)
    print(listener.getsockname()[1], flush=True)
    connection, _ = listener.accept()
    print('accepted', flush=True)
    while connection.recv(65536):
        pass
    print('eof', flush=True)
    time.sleep(600)
)PY";

// A python3 server on the host's loopback, killed when the test ends.
class host_server {
  public:
    explicit host_server(std::vector<std::string> args) {
        int out[2];
        REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
        args.insert(args.begin(), {"/usr/bin/python3", "-c", server_script});
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            ::dup2(out[1], 1);
            const int null = ::open("/dev/null", O_WRONLY);
            ::dup2(null, 2);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
        ::close(out[1]);
        out_ = out[0];
        const auto port = read_line(10s);
        REQUIRE_MESSAGE(port, "the test server did not start");
        port_ = std::stoi(*port);
    }
    ~host_server() {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        ::close(out_);
    }
    host_server(const host_server&) = delete;
    host_server& operator=(const host_server&) = delete;

    int port() const { return port_; }

    // The same, running `io` while it waits (the proxy lives there).
    std::optional<std::string> read_line(asio::io_context& io, std::chrono::milliseconds limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < end) {
            if (auto line = read_line(0ms)) return line;
            io.restart();
            io.run_for(20ms);
        }
        return read_line(0ms);
    }

    // The next line the server prints, or nullopt by `limit` (or at its EOF).
    std::optional<std::string> read_line(std::chrono::milliseconds limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        for (;;) {
            if (auto newline = buffer_.find('\n'); newline != std::string::npos) {
                std::string line = buffer_.substr(0, newline);
                buffer_.erase(0, newline + 1);
                return line;
            }
            const auto left = std::max(0ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                end - std::chrono::steady_clock::now()));
            pollfd p{out_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                if (left == 0ms) return std::nullopt;
                continue;
            }
            char chunk[256];
            const ssize_t n = ::read(out_, chunk, sizeof chunk);
            if (n <= 0) return std::nullopt;
            buffer_.append(chunk, static_cast<std::size_t>(n));
        }
    }

  private:
    pid_t pid_ = -1;
    int out_ = -1;
    int port_ = 0;
    std::string buffer_;
};

int run_host(const std::string& command) {
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A PEP 503 simple index with one wheel the test builds, a text file, and a self-signed
// certificate for pypi.test (its own CA).
struct mirror_files {
    mirror_files() {
        char name[] = "/tmp/moat-egress-XXXXXX";
        REQUIRE(::mkdtemp(name) != nullptr);
        dir = name;
        std::filesystem::create_directories(dir + "/www/simple/demo-pkg");
        std::filesystem::create_directories(dir + "/www/packages");
        std::ofstream(dir + "/www/hello.txt") << "hello from the mirror\n";
        std::ofstream(dir + "/www/simple/demo-pkg/index.html")
            << "<!DOCTYPE html><html><body><a href=\"../../packages/"
               "demo_pkg-1.0-py3-none-any.whl\">demo_pkg-1.0-py3-none-any.whl</a></body></html>\n";
        const std::string wheel = dir + "/www/packages/" + moat::test::demo_wheel_name;
        REQUIRE(run_host(moat::test::demo_wheel_command("/usr/bin/python3", wheel)) == 0);
        cert = dir + "/cert.pem";
        key = dir + "/key.pem";
        REQUIRE(run_host("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                         "-nodes -days 2 -subj /CN=pypi.test -addext subjectAltName=DNS:pypi.test "
                         "-keyout " +
                         key + " -out " + cert + " >/dev/null 2>&1") == 0);
        std::ifstream in(cert);
        cert_pem.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    ~mirror_files() { std::filesystem::remove_all(dir); }
    std::string dir, cert, key, cert_pem;
};

moat::sandbox_network mirror_network(const std::vector<int>& ports) {
    moat::sandbox_network n;
    n.mode = moat::network_mode::allow_list;
    for (int port : ports) n.allow_hosts.push_back("pypi.test:" + std::to_string(port));
    n.resolve = {"pypi.test=127.0.0.1"};
    n.allow_addresses = {"127.0.0.1/32"};
    return n;
}

// A non-loopback IPv4 address of the host, if it has one.
std::optional<std::string> host_address() {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return std::nullopt;
    std::optional<std::string> found;
    for (auto* a = list; a != nullptr && !found; a = a->ifa_next) {
        if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
        const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
        if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
        char text[INET_ADDRSTRLEN];
        if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
    }
    ::freeifaddrs(list);
    return found;
}

}  // namespace

// issue 37: pip install as the model runs it, through the tool layer: the index is the mirror,
// reached through the proxy on the allow-list, and what it installs imports in the next
// run_python call of the same interpreter.
TEST_CASE_FIXTURE(local_fixture,
                  "pip installs from the allow-listed mirror through the proxy, and the next "
                  "run_python call imports it") {
    MOAT_REQUIRE_NAMESPACES();
    if (::access("/usr/lib/python3/dist-packages/pip", F_OK) != 0) {
        MESSAGE("SKIPPED: the host has no Debian pip for the sandbox's Python environment");
        return;
    }
    mirror_files files;
    host_server mirror({"http", files.dir + "/www"});
    const std::string port = std::to_string(mirror.port());
    moat::runtime rt(*local);
    moat::manager_options options;
    options.spec.network = mirror_network({mirror.port()});
    moat::session_manager manager(rt, options);
    moat::tool_session tools(manager, "pip");
    // The model is told where pip can install from: the mirror's host, not PyPI.
    for (const auto& d : tools.definitions()) {
        if (d.name != "run_shell" && d.name != "run_python") continue;
        CAPTURE(d.name);
        CHECK(d.description.find("pip install works only from an index on them") !=
              std::string::npos);
    }
    auto missing = run(tools.async_run_python("import demo_pkg"));
    REQUIRE(missing);
    CHECK(missing->error_type == "ModuleNotFoundError");
    CHECK(missing->hint.find("PyPI is not on this sandbox's allow-list") != std::string::npos);

    auto installed = run(tools.async_run_shell(
        "pip install --trusted-host pypi.test --index-url http://pypi.test:" + port +
            "/simple demo-pkg",
        120s));
    REQUIRE(installed);
    INFO(installed->stdout_text << installed->stderr_text);
    CHECK(installed->exit_code == 0);
    CHECK(installed->stdout_text.find("Successfully installed demo-pkg-1.0") != std::string::npos);
    auto imported = run(tools.async_run_python("import demo_pkg\nprint(demo_pkg.VALUE)"));
    REQUIRE(imported);
    CHECK(imported->stdout_text == "42\n");
    auto script = run(tools.async_run_shell("demo-tool"));
    REQUIRE(script);
    CHECK(script->stdout_text == "tool 42\n");
    (void)run(manager.async_shutdown());
}

TEST_CASE_FIXTURE(local_fixture,
                  "an allow-listed sandbox reaches its mirror through the proxy only") {
    MOAT_REQUIRE_NAMESPACES();
    mirror_files files;
    host_server mirror({"http", files.dir + "/www"});
    host_server tls({"https", files.dir + "/www", files.cert, files.key});
    const std::string port = std::to_string(mirror.port());
    const std::string tls_port = std::to_string(tls.port());

    moat::sandbox_spec spec;
    spec.network = mirror_network({mirror.port(), tls.port()});
    spec.env["HTTP_PROXY"] = "http://10.0.0.1:1";  // replaced: the proxy variables are forced
    const auto box = create(spec);
    CHECK(box.network == spec.network);

    SUBCASE("the proxy variables are set, and the caller's cannot replace them") {
        const auto r = sh(box.id, "echo $HTTP_PROXY $https_proxy $NO_PROXY");
        CHECK(r.out.text() ==
              "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1,::1\n");
    }
    SUBCASE("urllib and curl fetch from the allowed name") {
        const auto py = sh(box.id,
                           "python3 -c \"import urllib.request; print(urllib.request."
                           "urlopen('http://pypi.test:" +
                               port + "/hello.txt', timeout=20).read().decode(), end='')\"");
        CHECK(py.exit_code == 0);
        CHECK(py.out.text() == "hello from the mirror\n");
        const auto curl =
            sh(box.id, "curl -sS --max-time 20 http://pypi.test:" + port + "/hello.txt");
        CHECK(curl.exit_code == 0);
        CHECK(curl.out.text() == "hello from the mirror\n");
    }
    SUBCASE("pip download from the mirror's simple index") {
        const auto has_pip = sh(box.id, "python3 -m pip --version");
        if (has_pip.exit_code != 0) {
            MESSAGE(
                "SKIPPED pip download: python3 -m pip is not installed here (urllib and curl "
                "cover the proxy)");
            return;
        }
        const auto r = sh(
            box.id,
            "python3 -m pip download --no-deps --no-cache-dir "
            "--disable-pip-version-check --trusted-host pypi.test --index-url http://pypi.test:" +
                port + "/simple -d /workspace/dl demo-pkg && ls /workspace/dl",
            120s);
        INFO(r.out.text() << r.err.text());
        CHECK(r.exit_code == 0);
        CHECK(r.out.text().find("demo_pkg-1.0-py3-none-any.whl\n") != std::string::npos);
    }
    SUBCASE("another name gets the proxy's one-line reason") {
        const auto r = sh(box.id, "curl -sS --max-time 20 http://files.other.test:" + port + "/");
        INFO(r.out.text() << r.err.text());
        CHECK(r.out.text() ==
              "host files.other.test:" + port + " is not on this sandbox's allow-list\n");
        // The allowed name on a port its pattern does not name.
        const auto wrong_port = sh(box.id,
                                   "curl -sS --max-time 20 -o /dev/null -w '%{http_code}' "
                                   "http://pypi.test:1/");
        CHECK(wrong_port.out.text() == "403");
    }
    SUBCASE("the mirror's IP literal is refused, through the proxy or around it") {
        const auto proxied = sh(box.id,
                                "curl -sS --max-time 20 --noproxy '' -o /dev/null -w "
                                "'%{http_code}' http://127.0.0.1:" +
                                    port + "/hello.txt");
        CHECK(proxied.out.text() == "403");
        // Direct (NO_PROXY names 127.0.0.1): the sandbox's own loopback has no mirror.
        const auto direct = sh(box.id, "curl -sS --max-time 20 http://127.0.0.1:" + port + "/");
        CHECK(direct.exit_code == 7);  // couldn't connect
    }
    SUBCASE("without the proxy variables, or with a raw socket, nothing is reachable") {
        const auto unset = sh(box.id,
                              "env -u HTTP_PROXY -u http_proxy -u HTTPS_PROXY -u "
                              "https_proxy curl -sS --max-time 20 http://pypi.test:" +
                                  port + "/hello.txt");
        CHECK(unset.exit_code == 6);  // couldn't resolve: there is no resolver path out
        CHECK(unset.out.text().empty());
        if (auto address = host_address()) {
            const auto raw = sh(box.id,
                                "python3 -c \"import socket; s = socket.socket(); "
                                "s.settimeout(10)\ntry:\n s.connect(('" +
                                    *address + "', " + port +
                                    "))\n print('connected')\nexcept OSError as e:\n "
                                    "print(e.errno)\"");
            CHECK(raw.out.text() == "101\n");  // ENETUNREACH: no route out exists
        }
    }
    SUBCASE("HTTPS through CONNECT to an allowed name, checked against the test CA") {
        moat::file_write ca{"/workspace/ca.pem", files.cert_pem};
        const auto written = run(local->async_write_files(box.id, {ca}));
        REQUIRE(written);
        const auto r =
            sh(box.id, "curl -sS --max-time 20 --cacert /workspace/ca.pem https://pypi.test:" +
                           tls_port + "/hello.txt");
        INFO(r.err.text());
        CHECK(r.exit_code == 0);
        CHECK(r.out.text() == "hello from the mirror\n");
        const auto py = sh(box.id,
                           "python3 -c \"import ssl, urllib.request; c = "
                           "ssl.create_default_context(cafile='/workspace/ca.pem'); "
                           "print(urllib.request.urlopen('https://pypi.test:" +
                               tls_port +
                               "/hello.txt', context=c, timeout=20).read().decode(), "
                               "end='')\"");
        CHECK(py.out.text() == "hello from the mirror\n");
        // A refused CONNECT: curl reports the proxy's status.
        const auto refused = sh(box.id, "curl -sS --max-time 20 https://example.test/ 2>&1");
        CHECK(refused.out.text().find("403") != std::string::npos);
    }
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a sandbox with network none has no proxy endpoint and no proxy variables") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    CHECK(box.network.mode == moat::network_mode::none);
    const auto r = sh(box.id,
                      "env | grep -i _proxy; python3 -c \"import socket\ntry:\n "
                      "socket.create_connection(('127.0.0.1', 3128), timeout=10)\n "
                      "print('connected')\nexcept OSError as e:\n print(e.errno)\"");
    CHECK(r.out.text() == "111\n");  // ECONNREFUSED, and no variable printed
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a bad network entry fails the create naming it") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.network.mode = moat::network_mode::allow_list;
    spec.network.allow_hosts = {"py*pi.org"};
    auto made = run(local->async_create(spec));
    REQUIRE_FALSE(made);
    CHECK(made.error().code == moat::errc::invalid_argument);
    CHECK(made.error().detail.find("py*pi.org") != std::string::npos);
    spec.network.allow_hosts.clear();
    spec.network.mode = moat::network_mode::none;
    spec.network.resolve = {"pypi.test=127.0.0.1"};
    made = run(local->async_create(spec));
    REQUIRE_FALSE(made);
    CHECK(made.error().code == moat::errc::invalid_argument);
}

namespace {

// A sandbox that may reach only hang.test, a silent server on this host's loopback at `port`.
moat::sandbox_spec hang_spec(std::uint16_t port) {
    moat::sandbox_spec spec;
    spec.network.mode = moat::network_mode::allow_list;
    spec.network.allow_hosts = {"hang.test:" + std::to_string(port)};
    spec.network.resolve = {"hang.test=127.0.0.1"};
    spec.network.allow_addresses = {"127.0.0.1/32"};
    return spec;
}

// A process that opens a CONNECT tunnel to hang.test through the sandbox's proxy, prints the
// reply's status code, and holds the tunnel open.
moat::exec_request hang_tunnel(std::uint16_t port) {
    moat::exec_request tunnel;
    tunnel.shell =
        "python3 -c \"import socket, time; s = socket.create_connection(('127.0.0.1', "
        "3128)); s.sendall(b'CONNECT hang.test:" +
        std::to_string(port) +
        " HTTP/1.1\\r\\nHost: hang.test\\r\\n\\r\\n'); print(s.recv(100).split(b' ')[1]"
        ".decode(), flush=True); time.sleep(600)\"";
    return tunnel;
}

// A sandbox with a CONNECT tunnel to `silent` (a server that never answers), held open by a
// process in the sandbox; returns once the server has the connection.
moat::sandbox_info create_with_hung_tunnel(local_fixture& f, host_server& silent) {
    const auto box = f.create(hang_spec(silent.port()));
    auto started = f.run(f.local->async_spawn(box.id, hang_tunnel(silent.port())));
    REQUIRE(started);
    CHECK(silent.read_line(f.io, 20s) == std::optional<std::string>("accepted"));
    return box;
}

// The egress log lines of one sandbox (every sandbox's when `id` is empty) while it lives
// (moat's log sink; reset when it goes).
struct egress_log {
    explicit egress_log(std::string id = "") {
        moat::set_log_sink([this, id = std::move(id)](const moat::log_record& r) {
            if (r.component == "egress" && (id.empty() || r.sandbox_id == id))
                lines.emplace_back(r.message);
        });
    }
    ~egress_log() { moat::set_log_sink({}); }
    egress_log(const egress_log&) = delete;
    egress_log& operator=(const egress_log&) = delete;

    // Whether a line starting with `prefix` came, waiting for it (bounded) on `f`'s executor: a
    // connection logs its end when its task finishes, which may be after the call that ended it.
    bool saw(local_fixture& f, const std::string& prefix) {
        const auto logged = [&] {
            return std::any_of(lines.begin(), lines.end(),
                               [&](const std::string& e) { return e.starts_with(prefix); });
        };
        (void)f.run(moat::test::until(logged, 10s));
        return logged();
    }

    std::vector<std::string> lines;
};

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "destroying a sandbox closes its proxied connections") {
    MOAT_REQUIRE_NAMESPACES();
    host_server silent({"silent"});
    const auto box = create_with_hung_tunnel(*this, silent);
    // The proxy's events reach moat's log; the tunnel's end must be the destroy's doing ("sandbox
    // closed"), not the sandbox's processes dying afterwards ("done").
    egress_log events(box.id);
    destroy(box.id);
    CHECK(silent.read_line(io, 20s) == std::optional<std::string>("eof"));
    const std::string closed =
        "closed hang.test:" + std::to_string(silent.port()) + " (sandbox closed";
    CHECK(events.saw(*this, closed));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a backend destroyed with a tunnel open, its executor still running, closes it "
                  "safely") {
    MOAT_REQUIRE_NAMESPACES();
    host_server silent({"silent"});
    const auto box = create_with_hung_tunnel(*this, silent);
    // The backend goes (as when the application drops it) while the relay's task is still queued
    // on the executor, which keeps running: the task must end without touching the freed proxy
    // (ASan watches this), and the upstream side of the tunnel must be closed.
    shut_down();
    CHECK(silent.read_line(io, 20s) == std::optional<std::string>("eof"));
}

TEST_CASE_FIXTURE(local_fixture, "a backend that attaches to a survivor serves its proxy") {
    MOAT_REQUIRE_NAMESPACES();
    mirror_files files;
    host_server mirror({"http", files.dir + "/www"});
    moat::sandbox_spec spec;
    spec.network = mirror_network({mirror.port()});
    spec.survive_owner = true;
    const auto box = create(spec);
    // The creator goes away; its sandbox stays, and so does the agent's listener.
    local.reset();
    io.run_for(200ms);
    local = moat::make_local_backend(io.get_executor());
    const auto attached = run(local->async_attach(box.id));
    REQUIRE(attached);
    CHECK(attached->network == spec.network);
    const auto r =
        sh(box.id, "curl -sS --max-time 20 http://pypi.test:" + std::to_string(mirror.port()) +
                       "/hello.txt");
    CHECK(r.out.text() == "hello from the mirror\n");
    destroy(box.id);
}

TEST_CASE("moat run, create and exec take the network flags") {
    MOAT_REQUIRE_NAMESPACES();
    mirror_files files;
    host_server mirror({"http", files.dir + "/www"});
    const std::string port = std::to_string(mirror.port());
    const std::string flags = "--allow-host pypi.test:" + port +
                              " --resolve pypi.test=127.0.0.1 --allow-address 127.0.0.1/32";
    const std::string fetch = "curl -sS --max-time 20 http://pypi.test:" + port + "/hello.txt";

    const auto ran = moat::test::moat_cli("run " + flags + " -- " + fetch);
    CHECK(ran.exit_code == 0);
    CHECK(ran.output == "hello from the mirror\n");
    // Without the flags: loopback only, no resolver.
    const auto closed = moat::test::moat_cli("run -- " + fetch);
    CHECK(closed.exit_code == 6);

    // A sandbox made by one process and used by another after its creator exited.
    const auto created = moat::test::moat_cli("create --ttl 120 " + flags);
    REQUIRE(created.exit_code == 0);
    const std::string id = created.output.substr(created.output.rfind("sb-"), 23);
    const auto listed = moat::test::moat_cli("ls --json");
    CHECK(listed.output.find(
              R"("network":{"mode":"allow-list","allow_hosts":["pypi.test:)" + port +
              R"("],"resolve":["pypi.test=127.0.0.1"],"allow_addresses":["127.0.0.1/32"]})") !=
          std::string::npos);
    const auto exec = moat::test::moat_cli("exec " + id + " -- " + fetch);
    CHECK(exec.exit_code == 0);
    CHECK(exec.output == "hello from the mirror\n");
    CHECK(moat::test::moat_cli("destroy " + id).exit_code == 0);

    const auto bad = moat::test::moat_cli("run --allow-host 'py*pi.org' -- true");
    CHECK(bad.exit_code == 2);
    CHECK(bad.output.find("py*pi.org") != std::string::npos);
    CHECK(std::count(bad.output.begin(), bad.output.end(), '\n') == 1);
    const auto conflict = moat::test::moat_cli("create --network all --allow-host pypi.org");
    CHECK(conflict.exit_code == 2);
    CHECK(moat::test::moat_cli("run --network some -- true").exit_code == 2);
}

TEST_CASE("moat network narrows a running sandbox's rules and refuses to widen them") {
    MOAT_REQUIRE_NAMESPACES();
    mirror_files files;
    host_server mirror({"http", files.dir + "/www"});
    const std::string port = std::to_string(mirror.port());
    const std::string pins = " --resolve pypi.test=127.0.0.1 --allow-address 127.0.0.1/32";
    const std::string flags = "--allow-host pypi.test:" + port + " --allow-host files.test" + pins;
    const std::string fetch = "curl -sS --max-time 20 http://pypi.test:" + port + "/hello.txt";
    const auto created = moat::test::moat_cli("create --ttl 120 " + flags);
    REQUIRE(created.exit_code == 0);
    const std::string id = created.output.substr(created.output.rfind("sb-"), 23);
    CHECK(moat::test::moat_cli("exec " + id + " -- " + fetch).output == "hello from the mirror\n");

    const auto narrowed = moat::test::moat_cli("network " + id + " --allow-host files.test" + pins);
    CHECK(narrowed.exit_code == 0);
    CHECK(narrowed.output == id + ": network allow-list files.test\n");
    const auto refused = moat::test::moat_cli("exec " + id + " -- " + fetch);
    CHECK(refused.output.find("is not on this sandbox's allow-list") != std::string::npos);

    // Back within what it was created with, then past it: exit 3, the host named.
    CHECK(moat::test::moat_cli("network " + id + " " + flags).exit_code == 0);
    CHECK(moat::test::moat_cli("exec " + id + " -- " + fetch).output == "hello from the mirror\n");
    const auto wider = moat::test::moat_cli("network " + id + " --allow-host evil.test");
    CHECK(wider.exit_code == 3);
    CHECK(wider.output.find("\"evil.test\" is outside") != std::string::npos);
    CHECK(moat::test::moat_cli("network").exit_code == 2);
    CHECK(moat::test::moat_cli("destroy " + id).exit_code == 0);
}

TEST_CASE_FIXTURE(local_fixture, "moat serve applies its operator network flags to every sandbox") {
    MOAT_REQUIRE_NAMESPACES();
    mirror_files files;
    host_server mirror({"http", files.dir + "/www"});
    const std::string port = std::to_string(mirror.port());
    moat::test::serve_process_options options;
    options.extra_args = {"--allow-host",        "pypi.test:" + port, "--resolve",
                          "pypi.test=127.0.0.1", "--allow-address",   "127.0.0.1/32"};
    moat::test::serve_process server(options);
    // A request asking for more is not heard: the operator's policy is the sandbox's.
    const std::string body = files.dir + "/body.json";
    std::ofstream(body) << R"({"templateID":"base","timeout":60,"allow_internet_access":true})";
    const std::string reply = files.dir + "/reply.json";
    REQUIRE(run_host("curl -sS --max-time 30 -o " + reply + " -H 'X-API-Key: " + server.api_key() +
                     "' -H 'Content-Type: application/json' --data @" + body + " " +
                     server.api_url() + "/sandboxes") == 0);
    std::ifstream in(reply);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find("\"sandboxID\":\"");
    REQUIRE_MESSAGE(at != std::string::npos, text);
    const std::string id = text.substr(at + 13, 23);
    const auto attached = run(local->async_attach(id));
    REQUIRE(attached);
    CHECK(attached->network.mode == moat::network_mode::allow_list);
    CHECK(attached->network.allow_hosts == std::vector<std::string>{"pypi.test:" + port});
    const auto r = sh(id, "curl -sS --max-time 20 http://pypi.test:" + port +
                              "/hello.txt; curl -sS --max-time 20 -o /dev/null -w '%{http_code}' "
                              "http://other.test:" +
                              port + "/");
    CHECK(r.out.text() == "hello from the mirror\n403");
    destroy(id);
}

namespace {

// The e2b backend over a real `moat serve` started with `serve_args`: creates a sandbox with
// `network` through E2B's API and returns the policy the local sandbox below serve got.
struct e2b_over_serve {
    e2b_over_serve(local_fixture& f, std::vector<std::string> serve_args)
        : fixture(f), serve(options_with(std::move(serve_args))) {
        moat::e2b_config config;
        config.api_url = serve.api_url();
        config.sandbox_url = serve.envd_url();
        config.api_key = serve.api_key();
        config.request_timeout = 20s;
        e2b = moat::make_e2b_backend(fixture.io.get_executor(), config);
        observer = moat::make_e2b_backend(fixture.io.get_executor(), config);
    }

    static moat::test::serve_process_options options_with(std::vector<std::string> args) {
        moat::test::serve_process_options options;
        options.extra_args = std::move(args);
        return options;
    }

    moat::result<moat::sandbox_info> create(moat::sandbox_network network) {
        moat::sandbox_spec spec;
        spec.ttl = 60s;
        spec.network = std::move(network);
        return fixture.run(e2b->async_create(std::move(spec)));
    }

    // The network of the sandbox serve made, as the local backend below it recorded it. The
    // e2b backends report the same through serve's SandboxDetail: the creator's inspect and
    // another backend's (which does not hold it), however serve narrowed the request.
    moat::sandbox_network policy_of(moat::sandbox_network requested) {
        const auto made = create(std::move(requested));
        REQUIRE_MESSAGE(made, made.error().to_string());
        const auto seen = fixture.run(fixture.local->async_attach(made->id));
        REQUIRE(seen);
        for (auto* reporter : {e2b.get(), observer.get()}) {
            const auto reported = fixture.run(reporter->async_inspect(made->id));
            REQUIRE_MESSAGE(reported, reported.error().to_string());
            CHECK(reported->network.mode == seen->network.mode);
            CHECK(reported->network.allow_hosts == seen->network.allow_hosts);
        }
        detail = get_detail(made->id);
        CHECK(fixture.run(e2b->async_destroy(made->id)));
        return seen->network;
    }

    // GET /sandboxes/{id} as the SDK reads it (curl; bounded by --max-time).
    std::string get_detail(const std::string& id) {
        const std::string command = "curl -sS --max-time 20 -H 'X-API-Key: " + serve.api_key() +
                                    "' " + serve.api_url() + "/sandboxes/" + id;
        std::string out;
        FILE* pipe = ::popen(command.c_str(), "r");
        REQUIRE(pipe != nullptr);
        char chunk[4096];
        while (out.size() < 1024 * 1024) {
            const std::size_t n = std::fread(chunk, 1, sizeof chunk, pipe);
            if (n == 0) break;
            out.append(chunk, n);
        }
        CHECK(::pclose(pipe) == 0);
        return out;
    }

    local_fixture& fixture;
    moat::test::serve_process serve;
    std::unique_ptr<moat::backend> e2b;
    std::unique_ptr<moat::backend> observer;  // holds none of the sandboxes
    std::string detail;                       // the last policy_of's GET /sandboxes/{id} body
};

moat::sandbox_network allow(std::vector<std::string> hosts) {
    moat::sandbox_network n;
    n.mode = moat::network_mode::allow_list;
    n.allow_hosts = std::move(hosts);
    return n;
}

}  // namespace

TEST_CASE_FIXTURE(
    local_fixture,
    "the e2b backend's network none is none below serve, whatever the operator allows") {
    MOAT_REQUIRE_NAMESPACES();
    e2b_over_serve over(*this, {"--network", "all"});
    const auto none = over.policy_of({});
    CHECK(none.mode == moat::network_mode::none);
    CHECK_MESSAGE(over.detail.find(R"("allowInternetAccess":false)") != std::string::npos,
                  over.detail);
    moat::sandbox_network all;
    all.mode = moat::network_mode::all;
    CHECK(over.policy_of(all).mode == moat::network_mode::all);
    CHECK_MESSAGE(over.detail.find(R"("allowInternetAccess":true)") != std::string::npos,
                  over.detail);
}

TEST_CASE_FIXTURE(local_fixture,
                  "the e2b backend's allow-list narrows serve's operator policy, never widens it") {
    MOAT_REQUIRE_NAMESPACES();
    SUBCASE("operator all, request pypi.test: the sandbox allows pypi.test") {
        e2b_over_serve over(*this, {"--network", "all", "--resolve", "pypi.test=127.0.0.1",
                                    "--allow-address", "127.0.0.1/32"});
        const auto got = over.policy_of(allow({"pypi.test"}));
        CHECK(got.mode == moat::network_mode::allow_list);
        CHECK(got.allow_hosts == std::vector<std::string>{"pypi.test"});
        CHECK(got.resolve == std::vector<std::string>{"pypi.test=127.0.0.1"});
    }
    SUBCASE("operator pypi.test and files.test, request pypi.test and evil.test: pypi.test") {
        e2b_over_serve over(*this, {"--allow-host", "pypi.test", "--allow-host", "files.test"});
        const auto got = over.policy_of(allow({"pypi.test", "evil.test"}));
        CHECK(got.mode == moat::network_mode::allow_list);
        CHECK(got.allow_hosts == std::vector<std::string>{"pypi.test"});
        CHECK(over.policy_of(allow({"evil.test"})).mode == moat::network_mode::none);
    }
    SUBCASE("operator none, request all or a list: none") {
        e2b_over_serve over(*this, {});
        moat::sandbox_network all;
        all.mode = moat::network_mode::all;
        CHECK(over.policy_of(all).mode == moat::network_mode::none);
        CHECK(over.policy_of(allow({"pypi.test"})).mode == moat::network_mode::none);
    }
}

TEST_CASE_FIXTURE(local_fixture,
                  "the e2b backend updates a sandbox's network through serve, within its flags") {
    MOAT_REQUIRE_NAMESPACES();
    e2b_over_serve over(*this, {"--allow-host", "pypi.test", "--allow-host", "files.test"});
    const auto made = over.create(allow({"pypi.test"}));
    REQUIRE_MESSAGE(made, made.error().to_string());
    const auto updated = run(over.e2b->async_update_network(made->id, allow({"files.test"})));
    REQUIRE_MESSAGE(updated, updated.error().to_string());
    CHECK(updated->network.allow_hosts == std::vector<std::string>{"files.test"});
    // Below serve, the local sandbox has it too.
    const auto seen = run(local->async_attach(made->id));
    REQUIRE(seen);
    CHECK(seen->network.allow_hosts == std::vector<std::string>{"files.test"});
    // Past the operator's flags: serve's 403, naming the host.
    const auto refused =
        run(over.e2b->async_update_network(made->id, allow({"files.test", "evil.test"})));
    REQUIRE_FALSE(refused);
    CHECK_MESSAGE(refused.error().detail.find("evil.test") != std::string::npos,
                  refused.error().detail);
    CHECK(run(over.e2b->async_update_network(made->id, {})));
    CHECK(run(over.e2b->async_inspect(made->id))->network.mode == moat::network_mode::none);
    CHECK(run(over.e2b->async_destroy(made->id)));
}

TEST_CASE_FIXTURE(local_fixture,
                  "the e2b backend refuses what E2B's network options cannot express") {
    MOAT_REQUIRE_NAMESPACES();
    e2b_over_serve over(*this, {"--network", "all"});
    auto port = allow({"pypi.test:8080"});
    auto resolve = allow({"pypi.test"});
    resolve.resolve = {"pypi.test=127.0.0.1"};
    auto address = allow({"pypi.test"});
    address.allow_addresses = {"127.0.0.1/32"};
    const std::vector<std::pair<moat::sandbox_network, std::string>> cases = {
        {port, "pypi.test:8080"}, {resolve, "pypi.test=127.0.0.1"}, {address, "127.0.0.1/32"}};
    for (const auto& [network, named] : cases) {
        const auto made = over.create(network);
        REQUIRE_FALSE(made);
        CHECK(made.error().code == moat::errc::not_supported);
        CHECK_MESSAGE(made.error().detail.find(named) != std::string::npos, made.error().detail);
    }
    // Refused before any request: serve never made a sandbox.
    const auto listed = run(over.e2b->async_list({}));
    REQUIRE(listed);
    CHECK(listed->empty());
    const auto bad = over.create(allow({"py*pi.org"}));
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == moat::errc::invalid_argument);
    CHECK(bad.error().detail.find("py*pi.org") != std::string::npos);
}

// The dev stage only (not under the sanitizers): a measurement that prints what it found.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
namespace {

// Host-wide TCP memory (/proc/net/sockstat's "mem", pages), in bytes.
std::uint64_t tcp_memory_bytes() {
    std::ifstream in("/proc/net/sockstat");
    std::string line;
    while (std::getline(in, line)) {
        if (!line.starts_with("TCP:")) continue;
        const auto at = line.find(" mem ");
        if (at == std::string::npos) return 0;
        return std::stoull(line.substr(at + 5)) *
               static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    }
    return 0;
}

// A process in the sandbox that opens `count` CONNECT tunnels to hang.test:PORT and never reads
// from them.
moat::exec_request stalled_tunnels(std::uint16_t port, int count) {
    moat::exec_request stall;
    stall.shell =
        "python3 -c \"import socket, time\nheld = []\nfor i in range(" + std::to_string(count) +
        "):\n s = socket.create_connection(('127.0.0.1', 3128))\n s.sendall(b'CONNECT "
        "hang.test:" +
        std::to_string(port) + " HTTP/1.1\\r\\n\\r\\n')\n held.append(s)\ntime.sleep(600)\"";
    return stall;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a sandbox with 32 stalled downloads pins a bounded amount of host memory, "
                  "shown by moat inventory") {
    MOAT_REQUIRE_NAMESPACES();
    host_server source({"source"});
    auto spec = hang_spec(static_cast<std::uint16_t>(source.port()));
    spec.labels["test"] = "stalled-tunnels";
    const auto box = create(spec);
    const std::uint64_t tcp_before = tcp_memory_bytes();
    auto started = run(
        local->async_spawn(box.id, stalled_tunnels(static_cast<std::uint16_t>(source.port()), 32)));
    REQUIRE(started);
    // The first tunnel reaches the server; the others follow, or are refused once the stalled
    // ones hold the sandbox's cap.
    REQUIRE(source.read_line(io, 20s) == std::optional<std::string>("accepted"));
    int admitted = 1;
    // Until what the proxy holds stops growing (bounded: 10 s).
    std::uint64_t held = 0;
    std::uint64_t last = 0;
    for (int i = 0; i < 50; ++i) {
        run(moat::test::pause(200ms));
        const auto listed = run(local->async_list({{"test", "stalled-tunnels"}}));
        REQUIRE(listed);
        REQUIRE(listed->size() == 1);
        REQUIRE(listed->front().egress_buffered_bytes);
        held = *listed->front().egress_buffered_bytes;
        if (held > 0 && held == last) break;
        last = held;
    }
    const std::uint64_t tcp_after = tcp_memory_bytes();
    while (source.read_line(0ms)) ++admitted;
    MESSAGE(
        "32 stalled downloads ("
        << admitted << " admitted): the proxy holds " << held / 1024 << " KiB of host memory ("
        << "counted per sandbox, cap 16384 KiB); host-wide TCP memory grew by "
        << (tcp_after > tcp_before ? (tcp_after - tcp_before) / 1024 : 0)
        << " KiB (including the sandbox's own sockets and the test server's 64 KiB send buffer per "
           "tunnel)");
    CHECK(held > 0);
    CHECK(held <= moat::local_egress_limits{}.max_buffered_bytes);
    // Another process sees it too.
    const auto inventory = moat::test::moat_cli("inventory --json --label test=stalled-tunnels");
    CHECK(inventory.exit_code == 0);
    CHECK(inventory.output.find("\"egress_buffered_bytes\":0") == std::string::npos);
    CHECK(inventory.output.find("\"egress_buffered_bytes\":") != std::string::npos);
    destroy(box.id);
}
#endif

TEST_CASE_FIXTURE(local_fixture,
                  "the egress byte budget is the sandbox's, whichever process serves it") {
    MOAT_REQUIRE_NAMESPACES();
    mirror_files files;
    std::ofstream(files.dir + "/www/big.bin") << std::string(600 * 1024, 'z');
    host_server mirror({"http", files.dir + "/www"});
    moat::local_options options;
    options.egress.max_bytes = 1 << 20;
    local = moat::make_local_backend(io.get_executor(), options);
    moat::sandbox_spec spec;
    spec.network = mirror_network({mirror.port()});
    spec.survive_owner = true;
    const auto box = create(spec);
    const std::string fetch =
        "curl -sS --max-time 20 -o /dev/null -w '%{size_download}' http://pypi.test:" +
        std::to_string(mirror.port()) + "/big.bin";
    CHECK(sh(box.id, fetch).out.text() == "614400");  // 600 KiB of the 1 MiB
    // The creator goes; a process that attaches later (its own default of 4 GiB) serves the
    // sandbox's proxy under the budget the sandbox was created with, and what is left of it.
    local.reset();
    io.run_for(200ms);
    local = moat::make_local_backend(io.get_executor());
    REQUIRE(run(local->async_attach(box.id)));
    const auto second = sh(box.id, fetch);
    CHECK(second.out.text() != "614400");  // cut off at the budget
    const auto third = sh(box.id,
                          "curl -sS --max-time 20 -o /dev/null -w '%{http_code}' "
                          "http://pypi.test:" +
                              std::to_string(mirror.port()) + "/hello.txt");
    CHECK(third.out.text() == "403");  // the budget is used up
    const auto listed = run(local->async_list({}));
    REQUIRE(listed);
    for (const auto& info : *listed) {
        if (info.id == box.id)
            CHECK(info.egress_bytes_used == std::optional<std::uint64_t>(1 << 20));
    }
    destroy(box.id);
}

// Live network rules (backend::async_update_network): two mirrors on the host's loopback, a.test
// and b.test, both inside the backend's network_limit; the sandbox starts with a.test only.
namespace {

struct live_network {
    explicit live_network(local_fixture& f)
        : fixture(f), files(), a({"http", files.dir + "/www"}), b({"http", files.dir + "/www"}) {}

    moat::sandbox_network only(const std::vector<std::string>& hosts) const {
        moat::sandbox_network n;
        n.mode = moat::network_mode::allow_list;
        for (const auto& host : hosts) {
            n.allow_hosts.push_back(host + ":" +
                                    std::to_string(host == "a.test" ? a.port() : b.port()));
        }
        n.resolve = {"a.test=127.0.0.1", "b.test=127.0.0.1"};
        n.allow_addresses = {"127.0.0.1/32"};
        return n;
    }
    moat::local_options options() const {
        moat::local_options o;
        o.network_limit = only({"a.test", "b.test"});
        return o;
    }
    // What curl in the sandbox gets from `host`'s hello.txt (the proxy's refusal line when it
    // refuses), through `through` (the fixture's backend by default).
    std::string fetch(const std::string& id, const std::string& host,
                      moat::backend* through = nullptr) {
        const int port = host == "a.test" ? a.port() : b.port();
        auto request = moat::exec_request{};
        request.shell = "curl -sS --max-time 20 http://" + host + ":" + std::to_string(port) +
                        "/hello.txt; curl -s --max-time 20 -x http://127.0.0.1:3128 "
                        " -o /dev/null -w '%{http_code}' http://" +
                        host + ":" + std::to_string(port) + "/hello.txt";
        auto& backend = through ? *through : *fixture.local;
        const auto r = fixture.run(backend.async_exec(id, request));
        REQUIRE(r);
        return r->out.text();
    }

    local_fixture& fixture;
    mirror_files files;
    host_server a;
    host_server b;
};

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a running sandbox's network narrows, and widens only within its limit") {
    MOAT_REQUIRE_NAMESPACES();
    live_network net(*this);
    local = moat::make_local_backend(io.get_executor(), net.options());
    moat::sandbox_spec spec;
    spec.network = net.only({"a.test"});
    const auto box = create(spec);
    CHECK(net.fetch(box.id, "a.test") == "hello from the mirror\n200");
    CHECK(net.fetch(box.id, "b.test").ends_with("403"));

    // Narrowed to nothing of a.test, widened to b.test (within the limit).
    const auto updated = run(local->async_update_network(box.id, net.only({"b.test"})));
    REQUIRE(updated);
    CHECK(updated->network == net.only({"b.test"}));
    CHECK(run(local->async_inspect(box.id))->network == net.only({"b.test"}));
    CHECK(net.fetch(box.id, "a.test").ends_with("403"));
    CHECK(net.fetch(box.id, "b.test") == "hello from the mirror\n200");

    // Past the limit: refused naming the host; the rules in force stay.
    auto wider = net.only({"b.test"});
    wider.allow_hosts.push_back("c.test");
    const auto refused = run(local->async_update_network(box.id, wider));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::permission_denied);
    CHECK(refused.error().detail.find("\"c.test\"") != std::string::npos);
    moat::sandbox_network all;
    all.mode = moat::network_mode::all;
    const auto everything = run(local->async_update_network(box.id, all));
    REQUIRE_FALSE(everything);
    CHECK(everything.error().code == moat::errc::permission_denied);
    CHECK(net.fetch(box.id, "b.test") == "hello from the mirror\n200");

    // Off, then back on: the endpoint stays while the network is off.
    const auto off = run(local->async_update_network(box.id, moat::sandbox_network{}));
    REQUIRE(off);
    CHECK(net.fetch(box.id, "b.test").ends_with("403"));
    REQUIRE(run(local->async_update_network(box.id, net.only({"a.test", "b.test"}))));
    CHECK(net.fetch(box.id, "a.test") == "hello from the mirror\n200");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "narrowing a sandbox's network closes its tunnels to the host") {
    MOAT_REQUIRE_NAMESPACES();
    host_server silent({"silent"});
    // other.test is within the backend's limit: moving to it is a change within bounds.
    auto narrowed = hang_spec(silent.port()).network;
    narrowed.allow_hosts = {"other.test"};
    moat::local_options options;
    options.network_limit = hang_spec(silent.port()).network;
    options.network_limit->allow_hosts.push_back("other.test");
    local = moat::make_local_backend(io.get_executor(), options);
    egress_log events;
    const auto box = create_with_hung_tunnel(*this, silent);
    // Relaying (the server accepts before the proxy has seen its connect complete): then the
    // update finds it open, and its end is logged.
    const std::string port = std::to_string(silent.port());
    REQUIRE(events.saw(*this, "allowed hang.test:" + port));
    REQUIRE(run(local->async_update_network(box.id, narrowed)));
    CHECK(silent.read_line(io, 20s) == std::optional<std::string>("eof"));
    const std::string closed = "closed hang.test:" + port +
                               " (policy changed: host hang.test:" + port +
                               " is not on this sandbox's";
    CHECK(events.saw(*this, closed));
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "another backend serving the same sandbox applies a network update") {
    MOAT_REQUIRE_NAMESPACES();
    live_network net(*this);
    local = moat::make_local_backend(io.get_executor(), net.options());
    moat::sandbox_spec spec;
    spec.network = net.only({"a.test"});
    spec.survive_owner = true;
    const auto box = create(spec);
    // A second backend (its own proxy, defaults: no limit of its own) attaches and serves too.
    auto other = moat::make_local_backend(io.get_executor());
    REQUIRE(run(other->async_attach(box.id)));
    CHECK(net.fetch(box.id, "a.test", other.get()) == "hello from the mirror\n200");
    // The first updates, within the limit the record keeps, then goes: the second alone serves.
    REQUIRE(run(local->async_update_network(box.id, net.only({"b.test"}))));
    local.reset();
    io.run_for(200ms);
    CHECK(net.fetch(box.id, "a.test", other.get()).ends_with("403"));
    CHECK(net.fetch(box.id, "b.test", other.get()) == "hello from the mirror\n200");
    CHECK(run(other->async_inspect(box.id))->network == net.only({"b.test"}));
    // The limit is the sandbox's, whichever process updates it.
    auto wider = net.only({"a.test", "b.test"});
    wider.allow_hosts.push_back("c.test");
    const auto refused = run(other->async_update_network(box.id, wider));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::permission_denied);
    REQUIRE(run(other->async_update_network(box.id, net.only({"a.test"}))));
    CHECK(net.fetch(box.id, "a.test", other.get()) == "hello from the mirror\n200");
    CHECK(run(other->async_destroy(box.id)));
    other.reset();
    io.run_for(200ms);
    local = moat::make_local_backend(io.get_executor());
}

TEST_CASE_FIXTURE(local_fixture, "a sandbox created with network none gets no network live") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    moat::sandbox_network all;
    all.mode = moat::network_mode::all;
    const auto refused = run(local->async_update_network(box.id, all));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::not_supported);
    CHECK(refused.error().detail.find("created with network none") != std::string::npos);
    CHECK(run(local->async_update_network(box.id, moat::sandbox_network{})));
    destroy(box.id);
}
