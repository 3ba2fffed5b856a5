// The file API of the local backend: round trips with commands, binary data, symlink escapes
// (checked against the host's real files), normalized errors, batch limits, atomic writes, stat
// and list_dir, and sandboxes that are gone.
#include "local/sandbox_files.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <random>
#include <sstream>

using moat::errc;
using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

std::vector<moat::file_write_result> write_batch(local_fixture& f, const std::string& id,
                                                 std::vector<moat::file_write> files) {
    auto r = f.run(f.local->async_write_files(id, std::move(files)));
    if (!r) FAIL("write_files failed: " << r.error().to_string());
    return std::move(*r);
}

moat::result<void> write_file(local_fixture& f, const std::string& id, const std::string& path,
                              const std::string& content, std::uint32_t mode = 0644) {
    moat::file_write file;
    file.path = path;
    file.content = content;
    file.mode = mode;
    std::vector<moat::file_write> files;
    files.push_back(std::move(file));
    auto results = write_batch(f, id, std::move(files));
    REQUIRE(results.size() == 1);
    CHECK(results[0].path == path);
    return results[0].outcome;
}

moat::result<std::string> read_file(local_fixture& f, const std::string& id,
                                    const std::string& path) {
    auto r = f.run(f.local->async_read_files(id, {path}));
    if (!r) FAIL("read_files failed: " << r.error().to_string());
    REQUIRE(r->size() == 1);
    CHECK((*r)[0].path == path);
    return std::move((*r)[0].content);
}

std::string host_sha256(const std::string& data) {
    char name[] = "/tmp/moat-files-test-XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()));
    ::close(fd);
    const std::string command = std::string("sha256sum ") + name;
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    char digest[65] = {};
    const std::size_t got = std::fread(digest, 1, 64, pipe);
    ::pclose(pipe);
    ::unlink(name);
    REQUIRE(got == 64);
    return digest;
}

std::string random_bytes(std::size_t size, unsigned seed) {
    std::mt19937 generator(seed);
    std::string out(size, '\0');
    for (char& c : out) c = static_cast<char>(generator() & 0xff);
    return out;
}

std::string all_byte_values() {
    std::string out;
    for (int b = 0; b < 256; ++b) out += static_cast<char>(b);
    return out;
}

bool code_is(const moat::error& e, std::initializer_list<errc> codes) {
    for (const errc c : codes) {
        if (e.code == c) return true;
    }
    return false;
}

// The lines of /proc/thread-self/status that hold this thread's credentials, plus the state a
// change of fsuid resets as a side effect (the dumpable flag, this thread's parent-death signal).
std::string thread_credentials() {
    std::istringstream in(moat::test::read_file("/proc/thread-self/status"));
    std::string line;
    std::string out;
    while (std::getline(in, line)) {
        for (const char* key : {"Uid:", "Gid:", "Groups:", "CapEff:", "CapPrm:"}) {
            if (line.rfind(key, 0) == 0) out += line + "\n";
        }
    }
    int pdeath_signal = 0;
    ::prctl(PR_GET_PDEATHSIG, &pdeath_signal, 0, 0, 0);
    out += "dumpable " + std::to_string(::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)) + "\n";
    out += "pdeathsig " + std::to_string(pdeath_signal) + "\n";
    return out;
}

// Starts a command and reads its output until `marker`; the stream (the running command) is
// handed back.
asio::awaitable<moat::result<moat::exec_stream>> start_until(moat::backend& b, std::string id,
                                                             moat::exec_request request,
                                                             std::string marker) {
    auto stream = co_await b.async_exec_stream(std::move(id), std::move(request));
    if (!stream) co_return std::move(stream).error();
    std::string seen;
    while (seen.find(marker) == std::string::npos) {
        auto next = co_await stream->async_next();
        if (!next) co_return std::move(next).error();
        auto* chunk = std::get_if<moat::output_chunk>(&*next);
        if (chunk == nullptr) co_return moat::make_error(errc::backend_failure, "ended early");
        seen += chunk->data;
    }
    co_return std::move(*stream);
}

asio::awaitable<void> pause(std::chrono::milliseconds how_long) {
    asio::steady_timer timer(co_await asio::this_coro::executor, how_long);
    co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace

TEST_CASE("validate_path accepts absolute paths and refuses the rest") {
    CHECK(moat::validate_path("/"));
    CHECK(moat::validate_path("/workspace/a b/c.txt"));
    CHECK(moat::validate_path("/workspace/../etc/passwd"));  // resolved later, inside the root
    CHECK(moat::validate_path("/" + std::string(moat::max_path_bytes - 1, 'a')));
    for (const std::string& bad :
         {std::string(), std::string("workspace/x"), std::string("./x"), std::string("/a\0b", 4),
          "/" + std::string(moat::max_path_bytes, 'a')}) {
        const auto r = moat::validate_path(bad);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == errc::invalid_path);
    }
    CHECK(moat::validate_path("relative").error().detail.find("relative") != std::string::npos);
}

TEST_CASE("split_path separates the parent directory from the last component") {
    const auto a = moat::split_path("/a/b/c");
    CHECK(a.parent == "/a/b");
    CHECK(a.name == "c");
    const auto top = moat::split_path("/c");
    CHECK(top.parent == "/");
    CHECK(top.name == "c");
    const auto trailing = moat::split_path("/a/");
    CHECK(trailing.parent == "/a");
    CHECK(trailing.name.empty());
    const auto root = moat::split_path("/");
    CHECK(root.parent == "/");
    CHECK(root.name.empty());
    const auto doubled = moat::split_path("//a//b");
    CHECK(doubled.parent == "//a/");
    CHECK(doubled.name == "b");
}

TEST_CASE_FIXTURE(local_fixture, "files written by the API are seen by commands and back") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // A parent-death signal the application set must survive file operations (an fsuid change
    // clears it). SIGCONT is harmless if the test runner does exit.
    ::prctl(PR_SET_PDEATHSIG, SIGCONT, 0, 0, 0);
    const std::string before = thread_credentials();
    REQUIRE(before.find("CapEff:") != std::string::npos);

    std::vector<moat::file_write> files(3);
    files[0].path = "/workspace/a.txt";
    files[0].content = "hello\n";
    files[0].mode = 0640;
    files[1].path = "/tmp/run.sh";
    files[1].content = "#!/bin/sh\necho run-me\n";
    files[1].mode = 04755;  // the setuid bit is dropped
    files[2].path = "/workspace/empty";
    const auto written = write_batch(*this, box.id, files);
    REQUIRE(written.size() == 3);
    for (std::size_t i = 0; i < written.size(); ++i) {
        CHECK(written[i].path == files[i].path);
        CHECK_MESSAGE(written[i].outcome, written[i].path);
    }
    CHECK(thread_credentials() == before);  // the fs identity and capabilities are back

    CHECK(sh(box.id, "stat -c '%u %g %a %s' /workspace/a.txt /tmp/run.sh /workspace/empty")
              .out.text() == "1000 1000 640 6\n1000 1000 755 22\n1000 1000 644 0\n");
    CHECK(sh(box.id, "cat /workspace/a.txt").out.text() == "hello\n");
    CHECK(sh(box.id, "/tmp/run.sh").out.text() == "run-me\n");

    sh(box.id, "printf from-command > /workspace/c.txt; mkdir /workspace/d");
    CHECK(*read_file(*this, box.id, "/workspace/c.txt") == "from-command");
    REQUIRE(write_file(*this, box.id, "/workspace/d/e", "in a command's directory"));
    CHECK(sh(box.id, "cat /workspace/d/e").out.text() == "in a command's directory");

    // Overwriting replaces the content; files persist across execs.
    REQUIRE(write_file(*this, box.id, "/workspace/c.txt", "from-api"));
    CHECK(sh(box.id, "cat /workspace/c.txt").out.text() == "from-api");
    sh(box.id, "echo appended >> /workspace/c.txt");
    sh(box.id, "true");
    CHECK(*read_file(*this, box.id, "/workspace/c.txt") == "from-apiappended\n");
    CHECK(*read_file(*this, box.id, "/workspace/a.txt") == "hello\n");
    CHECK(thread_credentials() == before);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "binary contents round trip exactly in both directions") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const std::string bytes = all_byte_values();
    const std::string noise = random_bytes(300 * 1000, 42);

    // API write -> command.
    REQUIRE(write_file(*this, box.id, "/workspace/all.bin", bytes));
    REQUIRE(write_file(*this, box.id, "/workspace/noise.bin", noise));
    CHECK(sh(box.id, "cat /workspace/all.bin").out.text() == bytes);
    CHECK(sh(box.id, "cat /workspace/noise.bin").out.text() == noise);
    CHECK(sh(box.id, "sha256sum < /workspace/all.bin").out.text().substr(0, 64) ==
          host_sha256(bytes));
    CHECK(sh(box.id, "sha256sum < /workspace/noise.bin").out.text().substr(0, 64) ==
          host_sha256(noise));

    // Command write -> API read.
    sh(box.id,
       "python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)))' > /workspace/gen.bin");
    CHECK(*read_file(*this, box.id, "/workspace/gen.bin") == bytes);
    const auto made = sh(box.id, "head -c 300000 /dev/urandom | tee /workspace/random.bin");
    REQUIRE_FALSE(made.out.is_truncated());
    const auto random = read_file(*this, box.id, "/workspace/random.bin");
    REQUIRE(random);
    CHECK(random->size() == 300000);
    CHECK(*random == made.out.text());
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "symlinks planted in the sandbox never reach the host") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const std::string host_passwd = moat::test::read_file("/etc/passwd");
    const std::string host_shadow = moat::test::read_file("/etc/shadow");
    const std::string host_hostname = moat::test::read_file("/etc/hostname");
    REQUIRE_FALSE(host_passwd.empty());
    REQUIRE_FALSE(host_hostname.empty());
    sh(box.id,
       "cd /workspace && ln -s /etc/shadow shadow && ln -s /proc/1/root/etc/hostname hostroot && "
       "ln -s /proc/self/fd/0 fd && ln -s /proc/self/root selfroot && "
       "ln -s /proc/1/root rootlink && ln -s ../../../../etc/passwd up && "
       "ln -s /etc/hostname escape && ln -s /etc etcdir");
    const std::string sandbox_passwd = sh(box.id, "cat /etc/passwd").out.text();
    REQUIRE(sandbox_passwd != host_passwd);

    for (const char* path :
         {"/workspace/shadow", "/workspace/hostroot", "/workspace/fd", "/workspace/selfroot",
          "/workspace/selfroot/etc/passwd", "/workspace/rootlink/etc/passwd", "/workspace/up",
          "/proc/1/root/etc/passwd", "/proc/self/root/etc/passwd", "/proc/self/fd/0",
          "/workspace/../../../etc/passwd", "/workspace/escape"}) {
        CAPTURE(path);
        const auto r = read_file(*this, box.id, path);
        if (r) {
            CHECK(*r != host_passwd);
            CHECK(*r != host_shadow);
            CHECK(*r != host_hostname);
        } else {
            CHECK_MESSAGE(code_is(r.error(), {errc::file_not_found, errc::invalid_path,
                                              errc::permission_denied}),
                          r.error().to_string());
            CHECK(r.error().detail.find(path) == 0);  // the sandbox's path, not a host one
            CHECK(r.error().detail.find("/proc/" + std::to_string(*box.host_pid)) ==
                  std::string::npos);
        }
    }
    // /proc magic links are refused (the kernel's ptrace check for a thread without capabilities
    // comes first: permission_denied; RESOLVE_NO_MAGICLINKS backs it: invalid_path); the
    // relative link and ".." stay inside the sandbox's root.
    const std::initializer_list<errc> refused = {errc::invalid_path, errc::permission_denied};
    CHECK(code_is(read_file(*this, box.id, "/workspace/hostroot").error(), refused));
    CHECK(code_is(read_file(*this, box.id, "/workspace/rootlink/etc/passwd").error(), refused));
    CHECK(*read_file(*this, box.id, "/workspace/up") == sandbox_passwd);
    CHECK(*read_file(*this, box.id, "/workspace/../../../etc/passwd") == sandbox_passwd);
    const auto listed = run(local->async_list_dir(box.id, "/workspace/rootlink"));
    REQUIRE_FALSE(listed);
    CHECK(code_is(listed.error(), refused));
    const auto stat_through = run(local->async_stat(box.id, "/workspace/rootlink/etc/hostname"));
    REQUIRE_FALSE(stat_through);
    CHECK(code_is(stat_through.error(), refused));

    // Writing through links: the link itself is replaced, or the write fails cleanly.
    const auto replaced = write_file(*this, box.id, "/workspace/escape", "pwned\n");
    CHECK(replaced);
    CHECK(sh(box.id, "test -L /workspace/escape || cat /workspace/escape").out.text() == "pwned\n");
    const auto into_etc = write_file(*this, box.id, "/workspace/etcdir/moat-pwned", "x");
    REQUIRE_FALSE(into_etc);
    CHECK(into_etc.error().code == errc::permission_denied);
    const auto into_host = write_file(*this, box.id, "/workspace/rootlink/tmp/moat-pwned", "x");
    REQUIRE_FALSE(into_host);
    CHECK(code_is(into_host.error(), refused));
    const auto through_proc = write_file(*this, box.id, "/proc/1/root/tmp/moat-pwned", "x");
    REQUIRE_FALSE(through_proc);
    CHECK(code_is(through_proc.error(), refused));

    // Magic links of a process the sandbox user owns (which it could follow itself) are refused
    // too.
    moat::exec_request request;
    request.shell =
        "sleep 60 & cd /workspace && ln -s /proc/$!/root/etc/passwd mine && ln -s /proc/$! pid && "
        "ln -s /proc/$!/fd/1 out && echo planted; wait";
    auto running = run(start_until(*local, box.id, request, "planted"));
    REQUIRE(running);
    for (const char* path : {"/workspace/mine", "/workspace/pid/root/etc/passwd",
                             "/workspace/pid/cwd/x", "/workspace/out"}) {
        CAPTURE(path);
        const auto r = read_file(*this, box.id, path);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(code_is(r.error(), refused), r.error().to_string());
    }
    const auto write_mine = write_file(*this, box.id, "/workspace/pid/root/tmp/moat-pwned", "x");
    REQUIRE_FALSE(write_mine);
    CHECK(code_is(write_mine.error(), refused));
    const auto stat_mine = run(local->async_stat(box.id, "/workspace/pid/root/etc"));
    REQUIRE_FALSE(stat_mine);
    CHECK(code_is(stat_mine.error(), refused));
    // The link itself is a symlink, and stat does not follow it.
    const auto link_itself = run(local->async_stat(box.id, "/workspace/pid/root"));
    REQUIRE(link_itself);
    CHECK(link_itself->type == moat::file_type::symlink);
    *running = moat::exec_stream();  // kills the command

    CHECK(moat::test::read_file("/etc/hostname") == host_hostname);
    CHECK(moat::test::read_file("/etc/passwd") == host_passwd);
    CHECK(::access("/etc/moat-pwned", F_OK) != 0);
    CHECK(::access("/tmp/moat-pwned", F_OK) != 0);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "each kind of bad path gets its normalized error") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto expect = [&](const auto& r, errc code, const std::string& path) {
        CAPTURE(path);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.error().code == code, r.error().to_string());
    };
    for (const std::string& path :
         {std::string("workspace/x"), std::string(), std::string("/workspace/a\0b", 14),
          "/workspace/" + std::string(5000, 'a')}) {
        expect(write_file(*this, box.id, path, "x"), errc::invalid_path, path);
        expect(read_file(*this, box.id, path), errc::invalid_path, path);
    }
    const auto relative = run(local->async_stat(box.id, "tmp"));
    REQUIRE_FALSE(relative);
    CHECK(relative.error().code == errc::invalid_path);
    const auto long_name = "/workspace/" + std::string(300, 'n');
    expect(write_file(*this, box.id, long_name, "x"), errc::invalid_path, long_name);

    expect(read_file(*this, box.id, "/workspace/missing"), errc::file_not_found, "missing");
    expect(write_file(*this, box.id, "/workspace/no-dir/x", "x"), errc::file_not_found, "no-dir");
    sh(box.id, "echo file > /workspace/plain");
    expect(write_file(*this, box.id, "/workspace/plain/x", "x"), errc::file_not_found, "plain/x");
    expect(read_file(*this, box.id, "/workspace"), errc::is_directory, "read /workspace");
    expect(write_file(*this, box.id, "/workspace", "x"), errc::is_directory, "/workspace");
    expect(write_file(*this, box.id, "/workspace/", "x"), errc::is_directory, "/workspace/");
    expect(write_file(*this, box.id, "/", "x"), errc::is_directory, "/");
    sh(box.id, "mkdir -p /workspace/full/sub");
    expect(write_file(*this, box.id, "/workspace/full", "x"), errc::is_directory, "full");

    expect(write_file(*this, box.id, "/usr/bin/moat-x", "x"), errc::permission_denied, "/usr");
    expect(write_file(*this, box.id, "/newfile", "x"), errc::permission_denied, "/newfile");
    expect(write_file(*this, box.id, "/etc/passwd", "x"), errc::permission_denied, "/etc");
    sh(box.id, "echo secret > /workspace/secret && chmod 000 /workspace/secret");
    expect(read_file(*this, box.id, "/workspace/secret"), errc::permission_denied, "mode 000");
    // The agent (sandbox root) is not readable to the sandbox user, so not to the API either.
    expect(read_file(*this, box.id, "/proc/1/environ"), errc::permission_denied, "environ");

    const std::string eleven_mib(11u << 20, 'x');
    expect(write_file(*this, box.id, "/workspace/big", eleven_mib), errc::too_large, "write big");
    sh(box.id, "head -c 11534336 /dev/zero > /workspace/big");
    expect(read_file(*this, box.id, "/workspace/big"), errc::too_large, "read big");
    const std::string ten_mib(10u << 20, 'y');
    REQUIRE(write_file(*this, box.id, "/workspace/ten", ten_mib));  // exactly the limit
    CHECK(read_file(*this, box.id, "/workspace/ten")->size() == ten_mib.size());

    const auto detail = read_file(*this, box.id, "/workspace/missing").error().detail;
    CHECK(detail.find("/workspace/missing") == 0);
    CHECK(sh(box.id, "ls -A /workspace | grep -c moat-; true").out.text() == "0\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a batch over its limits fails whole and writes nothing") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    std::vector<moat::file_write> many(101);
    for (std::size_t i = 0; i < many.size(); ++i) {
        many[i].path = "/workspace/f" + std::to_string(i);
        many[i].content = "x";
    }
    auto too_many = run(local->async_write_files(box.id, many));
    REQUIRE_FALSE(too_many);
    CHECK(too_many.error().code == errc::too_large);
    CHECK(too_many.error().detail.find("100 files") != std::string::npos);

    std::vector<moat::file_write> heavy(11);  // 11 x 9.5 MiB = 104.5 MiB
    for (std::size_t i = 0; i < heavy.size(); ++i) {
        heavy[i].path = "/workspace/h" + std::to_string(i);
        heavy[i].content.assign(19u << 19, 'h');
    }
    auto too_heavy = run(local->async_write_files(box.id, heavy));
    REQUIRE_FALSE(too_heavy);
    CHECK(too_heavy.error().code == errc::too_large);
    CHECK(too_heavy.error().detail.find(std::to_string(100u << 20)) != std::string::npos);
    CHECK(sh(box.id, "ls -A /workspace").out.text().empty());

    many.pop_back();  // exactly 100 files is fine
    const auto hundred = write_batch(*this, box.id, many);
    CHECK(hundred.size() == 100);
    CHECK(sh(box.id, "ls -A /workspace | wc -l").out.text() == "100\n");

    std::vector<std::string> paths;
    for (int i = 0; i < 101; ++i) paths.push_back("/workspace/f" + std::to_string(i));
    auto read_too_many = run(local->async_read_files(box.id, paths));
    REQUIRE_FALSE(read_too_many);
    CHECK(read_too_many.error().code == errc::too_large);

    // Reads stop adding content at the batch limit: the remaining paths say so.
    sh(box.id,
       "for i in 0 1 2 3 4 5 6 7 8 9 10; do head -c 9961472 /dev/zero > /workspace/h$i; "
       "done; echo small > /workspace/small");
    paths.clear();
    for (int i = 0; i < 11; ++i) paths.push_back("/workspace/h" + std::to_string(i));
    paths.emplace_back("/workspace/small");
    auto partial = run(local->async_read_files(box.id, paths));
    REQUIRE(partial);
    REQUIRE(partial->size() == 12);
    for (std::size_t i = 0; i < 10; ++i) {
        CAPTURE(i);
        REQUIRE((*partial)[i].content);
        CHECK((*partial)[i].content->size() == 9961472);
    }
    for (std::size_t i = 10; i < 12; ++i) {
        CAPTURE(i);
        REQUIRE_FALSE((*partial)[i].content);
        CHECK((*partial)[i].content.error().code == errc::too_large);
        CHECK((*partial)[i].content.error().detail.find("batch") != std::string::npos);
    }
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a write that fails leaves neither a partial file nor a temp") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.limits.workspace_bytes = 4u << 20;
    const auto box = create(spec);
    const std::string six_mib(6u << 20, 'z');

    const auto failed = write_file(*this, box.id, "/workspace/huge", six_mib);
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == errc::too_large);
    CHECK(failed.error().detail.find("no space") != std::string::npos);
    CHECK(sh(box.id, "ls -A /workspace").out.text().empty());

    REQUIRE(write_file(*this, box.id, "/workspace/keep", "old content"));
    const auto over = write_file(*this, box.id, "/workspace/keep", six_mib);
    REQUIRE_FALSE(over);
    CHECK(over.error().code == errc::too_large);
    CHECK(sh(box.id, "ls -A /workspace").out.text() == "keep\n");
    CHECK(sh(box.id, "cat /workspace/keep").out.text() == "old content");
    CHECK(*read_file(*this, box.id, "/workspace/keep") == "old content");
    // The space was given back: a file that fits still goes in.
    REQUIRE(write_file(*this, box.id, "/workspace/fits", std::string(3u << 20, 'f')));
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "stat and list_dir describe files, links, FIFOs and directories") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    sh(box.id,
       "cd /workspace && mkdir -p dir/sub && printf 12345 > dir/file && chmod 600 dir/file && "
       "ln -s file dir/link && mkfifo dir/pipe && ln -s /etc/hostname dir/abs");

    const auto file = run(local->async_stat(box.id, "/workspace/dir/file"));
    REQUIRE(file);
    CHECK(file->path == "/workspace/dir/file");
    CHECK(file->type == moat::file_type::regular);
    CHECK(file->size == 5);
    CHECK(file->mode == 0600);
    const auto link = run(local->async_stat(box.id, "/workspace/dir/link"));
    REQUIRE(link);
    CHECK(link->type == moat::file_type::symlink);
    CHECK(link->size == 4);
    const auto dir = run(local->async_stat(box.id, "/workspace/dir"));
    REQUIRE(dir);
    CHECK(dir->type == moat::file_type::directory);
    const auto pipe = run(local->async_stat(box.id, "/workspace/dir/pipe"));
    REQUIRE(pipe);
    CHECK(pipe->type == moat::file_type::other);
    const auto root = run(local->async_stat(box.id, "/"));
    REQUIRE(root);
    CHECK(root->type == moat::file_type::directory);
    const auto missing = run(local->async_stat(box.id, "/workspace/nothing"));
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == errc::file_not_found);

    const auto entries = run(local->async_list_dir(box.id, "/workspace/dir"));
    REQUIRE(entries);
    REQUIRE(entries->size() == 5);
    const std::pair<const char*, moat::file_type> expected[] = {
        {"abs", moat::file_type::symlink},   {"file", moat::file_type::regular},
        {"link", moat::file_type::symlink},  {"pipe", moat::file_type::other},
        {"sub", moat::file_type::directory},
    };
    for (std::size_t i = 0; i < entries->size(); ++i) {
        CHECK((*entries)[i].name == expected[i].first);
        CHECK((*entries)[i].type == expected[i].second);
    }
    CHECK((*entries)[1].size == 5);
    CHECK((*entries)[0].size == std::string("/etc/hostname").size());

    // Through a link to a directory, to itself, and errors.
    sh(box.id, "ln -s dir /workspace/dirlink");
    const auto through = run(local->async_list_dir(box.id, "/workspace/dirlink"));
    REQUIRE(through);
    CHECK(through->size() == 5);
    const auto not_dir = run(local->async_list_dir(box.id, "/workspace/dir/file"));
    REQUIRE_FALSE(not_dir);
    CHECK(not_dir.error().code == errc::invalid_path);
    const auto gone = run(local->async_list_dir(box.id, "/workspace/none"));
    REQUIRE_FALSE(gone);
    CHECK(gone.error().code == errc::file_not_found);
    const auto empty = run(local->async_list_dir(box.id, "/workspace/dir/sub"));
    REQUIRE(empty);
    CHECK(empty->empty());

    // A FIFO is refused at once (a read waiting for a writer would trip the test's watchdog), and
    // devices (the host's own nodes) are refused without being opened.
    const auto fifo = read_file(*this, box.id, "/workspace/dir/pipe");
    REQUIRE_FALSE(fifo);
    CHECK(fifo.error().code == errc::invalid_path);
    for (const char* device_path : {"/dev/zero", "/dev/random"}) {
        const auto device = read_file(*this, box.id, device_path);
        REQUIRE_FALSE(device);
        CHECK(device.error().code == errc::invalid_path);
    }
    // Writing over the FIFO replaces it with a regular file.
    REQUIRE(write_file(*this, box.id, "/workspace/dir/pipe", "now a file"));
    CHECK(sh(box.id, "cat /workspace/dir/pipe").out.text() == "now a file");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "list_dir refuses a directory past its entry limit") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    sh(box.id, "mkdir /workspace/many && cd /workspace/many && seq 1 10001 | xargs touch");
    const auto listed = run(local->async_list_dir(box.id, "/workspace/many"));
    REQUIRE_FALSE(listed);
    CHECK(listed.error().code == errc::too_large);
    sh(box.id, "rm /workspace/many/1");
    const auto exact = run(local->async_list_dir(box.id, "/workspace/many"));
    REQUIRE(exact);
    CHECK(exact->size() == 10000);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "file operations on a destroyed or ended sandbox fail cleanly") {
    MOAT_REQUIRE_NAMESPACES();
    const auto destroyed = create();
    destroy(destroyed.id);
    const auto check_all = [&](const std::string& id, errc code) {
        auto w = run(local->async_write_files(id, {moat::file_write{"/workspace/x", "x", 0644}}));
        REQUIRE_FALSE(w);
        CHECK(w.error().code == code);
        auto r = run(local->async_read_files(id, {"/workspace/x"}));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == code);
        auto s = run(local->async_stat(id, "/workspace"));
        REQUIRE_FALSE(s);
        CHECK(s.error().code == code);
        auto l = run(local->async_list_dir(id, "/workspace"));
        REQUIRE_FALSE(l);
        CHECK(l.error().code == code);
    };
    check_all(destroyed.id, errc::sandbox_not_found);

    moat::sandbox_spec spec;
    spec.ttl = 1s;
    const auto ended = create(spec);
    const pid_t init = *ended.host_pid;
    REQUIRE(write_file(*this, ended.id, "/workspace/x", "x"));
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(init); }, 10s));
    // Right away, before the helper's report may have arrived, and after it.
    check_all(ended.id, errc::sandbox_unavailable);
    run(pause(300ms));
    check_all(ended.id, errc::sandbox_unavailable);
    destroy(ended.id);
    check_all(ended.id, errc::sandbox_not_found);
}
