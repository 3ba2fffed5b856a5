// Sandboxes that outlive their creator: state records, attach from another backend, destroy from
// another backend, stale records and reused pids. Absence is checked from the host (/proc,
// cgroup directories, the state directory), never through the backend under test.
#include <doctest/doctest.h>

#include "local/sandbox_id.hpp"
#include "local/sandbox_records.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"
#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"
#include "wire/state_layout.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <fstream>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

const std::string state_dir = "/run/moat";

bool exists(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
}

moat::sandbox_spec survivor_spec() {
    moat::sandbox_spec spec;
    spec.survive_owner = true;
    spec.ttl = 10min;
    spec.labels["test"] = "persist";
    spec.env["GREETING"] = "from the record";
    return spec;
}

// What the host shows of a sandbox, captured while it runs.
struct host_traces {
    int pid = 0;
    std::vector<std::string> cgroups;
    std::string record;
    std::string socket;
};

host_traces traces_of(const moat::sandbox_info& box) {
    host_traces t;
    t.pid = *box.host_pid;
    for (const char* controller : {"memory", "pids", "cpu"}) {
        t.cgroups.push_back(moat::test::cgroup_dir(t.pid, controller));
    }
    t.record = moat::wire::record_path(state_dir, box.id);
    t.socket = moat::wire::attach_socket_path(state_dir, box.id);
    return t;
}

void check_gone(const host_traces& t) {
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(t.pid); }));
    for (const auto& dir : t.cgroups) CHECK_MESSAGE(!exists(dir), dir);
    CHECK_FALSE(exists(t.record));
    CHECK_FALSE(exists(t.socket));
}

}  // namespace

TEST_CASE(
    "a survivor outlives its creator, and another backend attaches, execs, copies and destroys") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    const auto box = creator.create(survivor_spec());
    REQUIRE(box.host_pid);
    const auto traces = traces_of(box);
    CHECK(exists(traces.record));
    CHECK(exists(traces.socket));
    CHECK(creator.sh(box.id, "echo kept > /workspace/state").exit_code == 0);
    creator.shut_down();
    CHECK(moat::test::is_running(traces.pid));

    local_fixture other;
    auto listed = other.run(other.local->async_list({{"test", "persist"}}));
    REQUIRE(listed);
    const auto it = std::find_if(listed->begin(), listed->end(),
                                 [&](const moat::sandbox_info& i) { return i.id == box.id; });
    REQUIRE(it != listed->end());
    CHECK(it->state == moat::sandbox_state::running);
    CHECK_FALSE(it->owned);
    CHECK(it->survive_owner);
    CHECK(it->host_pid == box.host_pid);

    // Not attached yet: exec says what to do.
    moat::exec_request request;
    request.shell = "true";
    auto early = other.run(other.local->async_exec(box.id, request));
    REQUIRE_FALSE(early);
    CHECK(early.error().code == moat::errc::sandbox_not_found);
    CHECK(early.error().detail.find("attach") != std::string::npos);

    auto attached = other.run(other.local->async_attach(box.id));
    REQUIRE(attached);
    CHECK(attached->id == box.id);
    CHECK(other.sh(box.id, "cat /workspace/state; echo $GREETING").out.text() ==
          "kept\nfrom the record\n");
    std::vector<moat::file_write> files(1);
    files[0].path = "/workspace/copied";
    files[0].content = std::string("\0\1\2binary", 9);
    auto written = other.run(other.local->async_write_files(box.id, files));
    REQUIRE(written);
    CHECK(written->front().outcome);
    CHECK(other.sh(box.id, "wc -c < /workspace/copied").out.text() == "9\n");

    // Attaching again is harmless.
    CHECK(other.run(other.local->async_attach(box.id)));

    auto destroyed = other.run(other.local->async_destroy(box.id));
    REQUIRE(destroyed);
    check_gone(traces);
    auto again = other.run(other.local->async_attach(box.id));
    REQUIRE_FALSE(again);
    CHECK(again.error().code == moat::errc::sandbox_not_found);
}

TEST_CASE("a backend destroys a sandbox it never attached, from its record alone") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    const auto box = creator.create(survivor_spec());
    const auto traces = traces_of(box);
    creator.shut_down();

    local_fixture other;
    auto destroyed = other.run(other.local->async_destroy(box.id));
    REQUIRE(destroyed);
    check_gone(traces);
}

TEST_CASE("destroying a sandbox from another backend is final for its owner too") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture owner;
    const auto box = owner.create(survivor_spec());
    const auto traces = traces_of(box);

    local_fixture other;
    REQUIRE(other.run(other.local->async_destroy(box.id)));
    check_gone(traces);
    // The owner learns it is gone instead of hanging, and can release its entry.
    moat::exec_request request;
    request.shell = "true";
    auto exec = owner.run(owner.local->async_exec(box.id, request));
    REQUIRE_FALSE(exec);
    CHECK(exec.error().code == moat::errc::sandbox_unavailable);
    CHECK(owner.run(owner.local->async_destroy(box.id)));
}

TEST_CASE("commands an attached process started die when it detaches, and the sandbox lives on") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    const auto box = creator.create(survivor_spec());
    const auto traces = traces_of(box);
    creator.shut_down();

    // Attach the way a library does, at the wire level, and start a command.
    const int control = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    REQUIRE(control >= 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, traces.socket.c_str(), sizeof address.sun_path - 1);
    REQUIRE(::connect(control, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    std::vector<std::byte> buffer(moat::wire::max_message_bytes);
    int fds[moat::wire::max_fds_per_message];
    std::size_t fd_count = 0;
    bool lost = false;
    REQUIRE(moat::wire::receive_record(control, buffer, fds, fd_count, lost, 0) ==
            static_cast<ssize_t>(sizeof(moat::wire::ready_message)));
    std::vector<std::string> argv = {"sleep", "1000"};
    std::vector<std::string> env = {"PATH=/usr/bin:/bin"};
    std::vector<std::byte> record;
    REQUIRE(moat::wire::encode_exec(1, 0, argv, env, "/", record));
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    const int stdio[3] = {null, null, null};
    REQUIRE(moat::wire::send_record(control, record, stdio, 0) ==
            static_cast<ssize_t>(record.size()));
    ::close(null);
    REQUIRE(moat::wire::receive_record(control, buffer, fds, fd_count, lost, 0) ==
            static_cast<ssize_t>(sizeof(moat::wire::started_message)));
    pid_t sleeper = -1;
    REQUIRE(moat::test::eventually([&] {
        sleeper = moat::test::find_descendant(traces.pid, "sleep 1000");
        return sleeper > 0;
    }));
    ::close(control);  // detach
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(sleeper); }));
    CHECK(moat::test::is_running(traces.pid));

    local_fixture cleaner;
    REQUIRE(cleaner.run(cleaner.local->async_destroy(box.id)));
    check_gone(traces);
}

TEST_CASE("attach refuses a sandbox that does not survive its owner") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture owner;
    moat::sandbox_spec spec;
    spec.labels["test"] = "persist";
    const auto box = owner.create(spec);
    CHECK_FALSE(exists(moat::wire::attach_socket_path(state_dir, box.id)));
    local_fixture other;
    auto attached = other.run(other.local->async_attach(box.id));
    REQUIRE_FALSE(attached);
    CHECK(attached.error().code == moat::errc::sandbox_unavailable);
    CHECK(attached.error().detail.find("survive_owner") != std::string::npos);
    owner.destroy(box.id);
}

TEST_CASE("extend_ttl through an attached backend reaches the sandbox and its record") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    auto spec = survivor_spec();
    spec.ttl = 1s;
    const auto box = creator.create(spec);
    const auto traces = traces_of(box);
    creator.shut_down();

    local_fixture other;
    REQUIRE(other.run(other.local->async_attach(box.id)));
    auto extended = other.run(other.local->async_extend_ttl(box.id, 1h));
    REQUIRE(extended);
    const moat::sandbox_records records(state_dir);
    auto record = records.read(box.id);
    REQUIRE(record);
    CHECK(record->expires_at > std::chrono::system_clock::now() + 50min);
    // Past the original TTL, it still runs.
    ::usleep(1'500'000);
    CHECK(moat::test::is_running(traces.pid));
    CHECK(other.sh(box.id, "echo alive").out.text() == "alive\n");
    other.destroy(box.id);
    check_gone(traces);
}

TEST_CASE("a survivor past its TTL ends with no host process of moat alive" *
          moat::test::runs_alone) {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    auto spec = survivor_spec();
    spec.ttl = 500ms;
    const auto box = creator.create(spec);
    const auto traces = traces_of(box);
    creator.shut_down();  // its helper is gone too: only the sandbox's own pid 1 keeps time
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(traces.pid); }));

    // Nobody was left to clean up: the record is stale, and says so.
    local_fixture other;
    auto info = other.run(other.local->async_inspect(box.id));
    REQUIRE(info);
    CHECK(info->state == moat::sandbox_state::exited);
    auto attached = other.run(other.local->async_attach(box.id));
    REQUIRE_FALSE(attached);
    CHECK(attached.error().code == moat::errc::sandbox_unavailable);
    CHECK(attached.error().detail.find("TTL expired") != std::string::npos);
    // Destroy releases what is left (cgroups, socket, record).
    REQUIRE(other.run(other.local->async_destroy(box.id)));
    check_gone(traces);
}

TEST_CASE("the next backend on the host sweeps a survivor that ended at its TTL, and nothing live" *
          moat::test::runs_alone) {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    auto spec = survivor_spec();
    spec.ttl = 500ms;
    const auto expired = creator.create(spec);
    const auto traces = traces_of(expired);
    const auto alive = creator.create(survivor_spec());  // a survivor that is still running
    const auto alive_traces = traces_of(alive);
    local_fixture bystander;  // another live backend's own sandbox
    const auto theirs = bystander.create();
    const auto their_traces = traces_of(theirs);
    creator.shut_down();
    REQUIRE(moat::test::eventually([&] { return !moat::test::is_running(traces.pid); }));

    // One operation of a new backend on the same state directory, with no destroy or janitor.
    local_fixture next;
    auto listed = next.run(next.local->async_list({}));
    REQUIRE(listed);
    for (const auto& info : *listed) CHECK_MESSAGE(info.id != expired.id, "still listed");
    check_gone(traces);
    // Nothing live was touched.
    for (const auto* live : {&alive_traces, &their_traces}) {
        CHECK(moat::test::is_running(live->pid));
        CHECK(exists(live->record));
        for (const auto& dir : live->cgroups) CHECK_MESSAGE(exists(dir), dir);
    }
    moat::exec_request probe;
    probe.argv = {"true"};
    CHECK(bystander.run(bystander.local->async_exec(theirs.id, probe)));
    REQUIRE(next.run(next.local->async_destroy(alive.id)));
    check_gone(alive_traces);
}

TEST_CASE("a record whose pid now belongs to another process is stale, never that process" *
          moat::test::runs_alone) {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture fixture;
    REQUIRE(fixture.run(fixture.local->async_list({})));  // the state directory exists
    const moat::sandbox_records records(state_dir);
    moat::sandbox_record forged;
    forged.id = moat::make_sandbox_id().value();
    forged.owner_instance = "test";
    forged.owner_pid = 1;
    forged.created_at = std::chrono::system_clock::now();
    forged.expires_at = forged.created_at + 1h;
    forged.survive_owner = true;
    // This very process: alive, but not started when the record says.
    forged.init_pid = static_cast<int>(::getpid());
    forged.init_start_ticks = moat::process_start_ticks(forged.init_pid) + 1;
    forged.layout.workdir = "/workspace";
    REQUIRE(records.write(forged));

    auto info = fixture.run(fixture.local->async_inspect(forged.id));
    REQUIRE(info);
    CHECK(info->state == moat::sandbox_state::exited);
    auto attached = fixture.run(fixture.local->async_attach(forged.id));
    REQUIRE_FALSE(attached);
    CHECK(attached.error().code == moat::errc::sandbox_unavailable);
    // Destroy removes the stale record and signals nothing (this test is still running).
    REQUIRE(fixture.run(fixture.local->async_destroy(forged.id)));
    CHECK_FALSE(exists(moat::wire::record_path(state_dir, forged.id)));
}

TEST_CASE("attach refuses a socket that is not served by the sandbox's pid 1") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    const auto box = creator.create(survivor_spec());
    const auto traces = traces_of(box);
    // An impostor takes the socket's path (as a confused or hostile host process could).
    ::unlink(traces.socket.c_str());
    const int impostor = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    REQUIRE(impostor >= 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, traces.socket.c_str(), sizeof address.sun_path - 1);
    REQUIRE(::bind(impostor, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(impostor, 4) == 0);

    local_fixture other;
    auto attached = other.run(other.local->async_attach(box.id));
    REQUIRE_FALSE(attached);
    CHECK(attached.error().code == moat::errc::protocol_error);
    ::close(impostor);
    creator.destroy(box.id);
    check_gone(traces);
}

TEST_CASE("a corrupt record is reported with its path and never trusted") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture fixture;
    REQUIRE(fixture.run(fixture.local->async_list({})));
    const std::string id = moat::make_sandbox_id().value();
    const std::string path = moat::wire::record_path(state_dir, id);
    {
        std::ofstream out(path);
        out << R"({"format":1,"id":")" << id << R"(","init_pid":"not a number"})";
    }
    auto info = fixture.run(fixture.local->async_inspect(id));
    REQUIRE_FALSE(info);
    CHECK(info.error().code == moat::errc::backend_failure);
    CHECK(info.error().detail.find(path) != std::string::npos);
    auto listed = fixture.run(fixture.local->async_list({}));
    REQUIRE(listed);
    for (const auto& i : *listed) CHECK(i.id != id);
    ::unlink(path.c_str());
}

TEST_CASE("sandbox records round-trip through JSON and reject malformed fields by name") {
    moat::sandbox_record r;
    r.id = moat::make_sandbox_id().value();
    r.labels = {{"k", "v \"quoted\" \xc3\xa9"}};
    r.owner_instance = "host/1/abc";
    r.owner_pid = 42;
    r.created_at =
        std::chrono::system_clock::time_point(std::chrono::milliseconds(1'700'000'000'123));
    r.expires_at = r.created_at + 1h;
    r.survive_owner = true;
    r.init_pid = 77;
    r.init_start_ticks = 123456789;
    r.uid_base = 1u << 20;
    r.cgroups = {"/sys/fs/cgroup/pids/moat/" + r.id};
    r.memory_cgroup = "";
    r.env = {{"A", "b"}};
    r.layout.workdir = "/workspace";
    r.layers = {"user_ns"};
    r.egress.max_bytes = 12345;
    r.egress.max_connections = 7;
    r.egress.max_buffered_bytes = 1 << 20;
    auto back = moat::record_from_json(moat::to_json(r));
    REQUIRE(back);
    CHECK(back->egress == r.egress);
    CHECK(back->id == r.id);
    CHECK(back->labels == r.labels);
    CHECK(back->created_at == r.created_at);
    CHECK(back->expires_at == r.expires_at);
    CHECK(back->init_start_ticks == r.init_start_ticks);
    CHECK(back->uid_base == r.uid_base);
    CHECK(back->cgroups == r.cgroups);
    CHECK(back->env == r.env);
    CHECK(back->limits.memory_bytes == r.limits.memory_bytes);

    // A record written before the egress limits has the defaults.
    std::string older = moat::to_json(r);
    older.erase(older.find(",\"egress\":{"),
                older.find("}", older.find(",\"egress\":{")) + 1 - older.find(",\"egress\":{"));
    auto defaulted = moat::record_from_json(older);
    REQUIRE(defaulted);
    CHECK(defaulted->egress == moat::local_egress_limits{});

    CHECK_FALSE(moat::record_from_json("{"));
    CHECK_FALSE(moat::record_from_json("[]"));
    std::string json = moat::to_json(r);
    // A cgroup outside this sandbox's own directory would steer destroy's rmdir elsewhere.
    std::string evil = json;
    evil.replace(evil.find("/sys/fs/cgroup/pids/moat/"), 25, "/sys/fs/cgroup/pids/../../");
    auto refused = moat::record_from_json(evil);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().detail.find("cgroups") != std::string::npos);
    std::string negative = json;
    negative.replace(negative.find("\"init_pid\":77"), 13, "\"init_pid\":-5");
    refused = moat::record_from_json(negative);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().detail.find("init_pid") != std::string::npos);
}
