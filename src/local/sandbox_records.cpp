#include "local/sandbox_records.hpp"

#include "core/json_writer.hpp"
#include "core/limits_json.hpp"
#include "local/cgroup_stats.hpp"
#include "wire/state_layout.hpp"

#include <moat/templates.hpp>

#include <simdjson.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace moat {
namespace {

constexpr std::int64_t record_format = 1;

std::int64_t to_unix_ms(std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

std::chrono::system_clock::time_point from_unix_ms(std::int64_t ms) {
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

void write_string_map(json_writer& w, const std::map<std::string, std::string>& map) {
    w.begin_object();
    for (const auto& [k, v] : map) w.key(k).value(v);
    w.end_object();
}

void write_string_list(json_writer& w, const std::vector<std::string>& list) {
    w.begin_array();
    for (const auto& s : list) w.value(s);
    w.end_array();
}

void write_network(json_writer& w, const sandbox_network& network) {
    w.begin_object();
    w.key("mode").value(std::string(to_string(network.mode)));
    for (const auto& [name, list] :
         {std::pair{"allow_hosts", &network.allow_hosts}, std::pair{"resolve", &network.resolve},
          std::pair{"allow_addresses", &network.allow_addresses}}) {
        w.key(name);
        write_string_list(w, *list);
    }
    w.end_object();
}

error bad_field(std::string_view name) {
    return make_error(errc::invalid_argument,
                      "sandbox record: field '" + std::string(name) + "' is missing or malformed");
}

// Readers for one field each; false when the field is missing or of another type.
bool read_string(simdjson::dom::object& o, std::string_view name, std::string& out) {
    std::string_view v;
    if (o[name].get_string().get(v) != simdjson::SUCCESS) return false;
    out.assign(v);
    return true;
}

template <class Int>
bool read_int(simdjson::dom::object& o, std::string_view name, Int& out) {
    std::int64_t v = 0;
    if (o[name].get_int64().get(v) != simdjson::SUCCESS) return false;
    if (v < static_cast<std::int64_t>(std::numeric_limits<Int>::min()) ||
        static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(std::numeric_limits<Int>::max()))
        return false;
    out = static_cast<Int>(v);
    return true;
}

bool read_uint64(simdjson::dom::object& o, std::string_view name, std::uint64_t& out) {
    return o[name].get_uint64().get(out) == simdjson::SUCCESS;
}

// A limit that may be absent (records older than the field); present, it must be an integer of
// the field's type.
template <class Int>
bool read_optional_limit(simdjson::dom::object& o, std::string_view name, std::optional<Int>& out) {
    out.reset();
    if (o[name].error() == simdjson::NO_SUCH_FIELD) return true;
    std::uint64_t v = 0;
    if (o[name].get_uint64().get(v) != simdjson::SUCCESS ||
        v > static_cast<std::uint64_t>(std::numeric_limits<Int>::max()))
        return false;
    out = static_cast<Int>(v);
    return true;
}

bool read_string_map(simdjson::dom::object& o, std::string_view name,
                     std::map<std::string, std::string>& out) {
    simdjson::dom::object map;
    if (o[name].get_object().get(map) != simdjson::SUCCESS) return false;
    for (auto field : map) {
        std::string_view value;
        if (field.value.get_string().get(value) != simdjson::SUCCESS) return false;
        out[std::string(field.key)] = std::string(value);
    }
    return true;
}

bool read_string_list(simdjson::dom::object& o, std::string_view name,
                      std::vector<std::string>& out) {
    simdjson::dom::array list;
    if (o[name].get_array().get(list) != simdjson::SUCCESS) return false;
    for (auto element : list) {
        std::string_view value;
        if (element.get_string().get(value) != simdjson::SUCCESS) return false;
        out.emplace_back(value);
    }
    return true;
}

// A network object under `name`; true (and `out` untouched) when the field is absent.
bool read_network(simdjson::dom::object& o, std::string_view name, sandbox_network& out) {
    if (o[name].error() == simdjson::NO_SUCH_FIELD) return true;
    simdjson::dom::object network;
    std::string mode;
    sandbox_network read;
    if (o[name].get_object().get(network) != simdjson::SUCCESS ||
        !read_string(network, "mode", mode) ||
        !read_string_list(network, "allow_hosts", read.allow_hosts) ||
        !read_string_list(network, "resolve", read.resolve) ||
        !read_string_list(network, "allow_addresses", read.allow_addresses))
        return false;
    if (mode == "none") {
        read.mode = network_mode::none;
    } else if (mode == "allow-list") {
        read.mode = network_mode::allow_list;
    } else if (mode == "all") {
        read.mode = network_mode::all;
    } else {
        return false;
    }
    out = std::move(read);
    return true;
}

bool valid_record_id(std::string_view id) {
    if (id.size() != 23 || !id.starts_with("sb-")) return false;
    return std::all_of(id.begin() + 3, id.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

result<void> write_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return make_error(errc::backend_failure, std::string("write: ") + std::strerror(errno));
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return {};
}

}  // namespace

std::string to_json(const sandbox_record& r) {
    json_writer w;
    w.begin_object();
    w.key("format").value(record_format);
    w.key("id").value(r.id);
    w.key("owner_instance").value(r.owner_instance);
    w.key("owner_pid").value(r.owner_pid);
    w.key("created_at_ms").value(to_unix_ms(r.created_at));
    w.key("expires_at_ms").value(to_unix_ms(r.expires_at));
    w.key("survive_owner").value(r.survive_owner);
    w.key("init_pid").value(r.init_pid);
    w.key("init_start_ticks").value(r.init_start_ticks);
    w.key("uid_base").value(static_cast<std::uint64_t>(r.uid_base));
    w.key("cgroups");
    write_string_list(w, r.cgroups);
    w.key("memory_cgroup").value(r.memory_cgroup);
    w.key("labels");
    write_string_map(w, r.labels);
    w.key("env");
    write_string_map(w, r.env);
    w.key("user").value(r.layout.user);
    w.key("home").value(r.layout.home);
    w.key("workdir").value(r.layout.workdir);
    w.key("artifacts_dir").value(r.layout.artifacts_dir);
    w.key("template").value(r.template_name);
    w.key("template_digest").value(r.template_digest);
    w.key("network");
    write_network(w, r.network);
    w.key("network_limit");
    write_network(w, r.network_limit);
    w.key("limits");
    write_limits_json(w, r.limits);
    w.key("layers");
    write_string_list(w, r.layers);
    w.key("condemned").value(r.condemned);
    w.key("paused_lifetime_ms").value(static_cast<std::uint64_t>(r.paused_lifetime.count()));
    if (r.paused_at) {
        w.key("paused_at_ms").value(to_unix_ms(*r.paused_at));
        w.key("ttl_left_ms").value(static_cast<std::uint64_t>(r.ttl_left.count()));
    }
    w.key("egress").begin_object();
    w.key("max_bytes").value(r.egress.max_bytes);
    w.key("max_connections").value(static_cast<std::uint64_t>(r.egress.max_connections));
    w.key("max_buffered_bytes").value(r.egress.max_buffered_bytes);
    w.end_object();
    w.end_object();
    return w.take() + "\n";
}

result<sandbox_record> record_from_json(std::string_view json) {
    if (json.size() > max_record_bytes) {
        return make_error(errc::invalid_argument, "sandbox record is larger than 1 MiB");
    }
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    simdjson::dom::element document;
    if (parser.parse(padded).get(document) != simdjson::SUCCESS) {
        return make_error(errc::invalid_argument, "sandbox record is not valid JSON");
    }
    simdjson::dom::object o;
    if (document.get_object().get(o) != simdjson::SUCCESS) return bad_field("(top level)");
    std::int64_t format = 0;
    if (!read_int(o, "format", format) || format != record_format) return bad_field("format");
    sandbox_record r;
    if (!read_string(o, "id", r.id) || !valid_record_id(r.id)) return bad_field("id");
    if (!read_string(o, "owner_instance", r.owner_instance)) return bad_field("owner_instance");
    if (!read_int(o, "owner_pid", r.owner_pid)) return bad_field("owner_pid");
    std::int64_t created = 0;
    std::int64_t expires = 0;
    if (!read_int(o, "created_at_ms", created)) return bad_field("created_at_ms");
    if (!read_int(o, "expires_at_ms", expires)) return bad_field("expires_at_ms");
    r.created_at = from_unix_ms(created);
    r.expires_at = from_unix_ms(expires);
    if (o["survive_owner"].get_bool().get(r.survive_owner) != simdjson::SUCCESS)
        return bad_field("survive_owner");
    if (!read_int(o, "init_pid", r.init_pid) || r.init_pid < 0) return bad_field("init_pid");
    if (!read_uint64(o, "init_start_ticks", r.init_start_ticks))
        return bad_field("init_start_ticks");
    if (!read_int(o, "uid_base", r.uid_base)) return bad_field("uid_base");
    if (!read_string_list(o, "cgroups", r.cgroups)) return bad_field("cgroups");
    if (!read_string(o, "memory_cgroup", r.memory_cgroup)) return bad_field("memory_cgroup");
    for (const auto& dir : r.cgroups) {
        // Only ever a moat cgroup of this sandbox: a corrupt record must not steer an rmdir.
        if (!dir.starts_with("/") || !dir.ends_with("/moat/" + r.id) ||
            dir.find("/..") != std::string::npos)
            return bad_field("cgroups");
    }
    if (!read_string_map(o, "labels", r.labels)) return bad_field("labels");
    if (!read_string_map(o, "env", r.env)) return bad_field("env");
    if (!read_string(o, "workdir", r.layout.workdir)) return bad_field("workdir");
    // Records written before the layout had only "workdir": the rest keeps its defaults.
    for (auto [name, field] : {std::pair{"user", &r.layout.user}, std::pair{"home", &r.layout.home},
                               std::pair{"artifacts_dir", &r.layout.artifacts_dir}}) {
        if (o[name].error() == simdjson::NO_SUCH_FIELD) continue;
        if (!read_string(o, name, *field)) return bad_field(name);
    }
    // Records written before templates: base.
    if (o["template"].error() != simdjson::NO_SUCH_FIELD &&
        (!read_string(o, "template", r.template_name) ||
         !read_string(o, "template_digest", r.template_digest)))
        return bad_field("template");
    // Records written before the network field: none; before the limit: the network.
    if (!read_network(o, "network", r.network)) return bad_field("network");
    r.network_limit = r.network;
    if (!read_network(o, "network_limit", r.network_limit)) return bad_field("network_limit");
    simdjson::dom::object limits;
    if (o["limits"].get_object().get(limits) != simdjson::SUCCESS) return bad_field("limits");
    if (!read_optional_limit(limits, "memory_bytes", r.limits.memory_bytes) ||
        !read_optional_limit(limits, "pids", r.limits.pids) ||
        !read_optional_limit(limits, "cpu_millicores", r.limits.cpu_millicores) ||
        !read_optional_limit(limits, "workspace_bytes", r.limits.workspace_bytes) ||
        !read_optional_limit(limits, "tmp_bytes", r.limits.tmp_bytes) ||
        !read_optional_limit(limits, "open_files", r.limits.open_files))
        return bad_field("limits");
    if (!read_string_list(o, "layers", r.layers)) return bad_field("layers");
    if (o["condemned"].get_bool().get(r.condemned) != simdjson::SUCCESS)
        return bad_field("condemned");
    // Records written before pause: never paused, the default paused lifetime.
    std::uint64_t lifetime_ms = 0;
    if (o["paused_lifetime_ms"].error() != simdjson::NO_SUCH_FIELD) {
        if (!read_uint64(o, "paused_lifetime_ms", lifetime_ms))
            return bad_field("paused_lifetime_ms");
        r.paused_lifetime = std::chrono::milliseconds(lifetime_ms);
    }
    if (o["paused_at_ms"].error() != simdjson::NO_SUCH_FIELD) {
        std::int64_t paused_at = 0;
        std::uint64_t ttl_left = 0;
        if (!read_int(o, "paused_at_ms", paused_at) || !read_uint64(o, "ttl_left_ms", ttl_left))
            return bad_field("paused_at_ms");
        r.paused_at = from_unix_ms(paused_at);
        r.ttl_left = std::chrono::milliseconds(ttl_left);
    }
    // Records written before the egress limits: the defaults.
    if (o["egress"].error() != simdjson::NO_SUCH_FIELD) {
        simdjson::dom::object egress;
        if (o["egress"].get_object().get(egress) != simdjson::SUCCESS ||
            !read_uint64(egress, "max_bytes", r.egress.max_bytes) ||
            !read_int(egress, "max_connections", r.egress.max_connections) ||
            !read_uint64(egress, "max_buffered_bytes", r.egress.max_buffered_bytes))
            return bad_field("egress");
    }
    return r;
}

std::string sandbox_records::socket_path(std::string_view id) const {
    return wire::attach_socket_path(state_dir_, id);
}

std::string sandbox_records::egress_meter_path(std::string_view id) const {
    return wire::egress_meter_path(state_dir_, id);
}

result<void> sandbox_records::write(const sandbox_record& record) const {
    static std::atomic<std::uint64_t> counter{0};
    const std::string path = wire::record_path(state_dir_, record.id);
    const std::string temporary =
        path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
    unique_fd fd(
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.is_open()) {
        return make_error(errc::backend_failure,
                          "sandbox record: create " + temporary + ": " + std::strerror(errno));
    }
    auto written = write_all(fd.get(), to_json(record));
    fd.reset();
    if (written && ::rename(temporary.c_str(), path.c_str()) != 0) {
        written = make_error(errc::backend_failure,
                             "sandbox record: rename to " + path + ": " + std::strerror(errno));
    }
    if (!written) ::unlink(temporary.c_str());
    return written;
}

result<sandbox_record> sandbox_records::update(
    std::string_view id, const std::function<result<void>(sandbox_record&)>& change) const {
    const std::string dir = wire::sandboxes_dir(state_dir_);
    unique_fd lock(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!lock.is_open() || ::flock(lock.get(), LOCK_EX) != 0) {
        return make_error(errc::backend_failure,
                          "sandbox record: lock " + dir + ": " + std::strerror(errno));
    }
    auto record = read(id);  // the lock goes with the descriptor
    if (!record) return record;
    if (auto changed = change(*record); !changed) return std::move(changed).error();
    if (auto written = write(*record); !written) return std::move(written).error();
    return record;
}

result<sandbox_record> sandbox_records::read(std::string_view id) const {
    if (!valid_record_id(id)) {
        return make_error(errc::sandbox_not_found,
                          "'" + std::string(id) + "' is not a sandbox id (sb- and 20 hex digits)");
    }
    const std::string path = wire::record_path(state_dir_, id);
    unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.is_open()) {
        if (errno == ENOENT) {
            return make_error(errc::sandbox_not_found,
                              "no sandbox with id '" + std::string(id) + "' on this host");
        }
        return make_error(errc::backend_failure,
                          "sandbox record: open " + path + ": " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<std::size_t>(st.st_size) > max_record_bytes) {
        return make_error(errc::backend_failure,
                          "sandbox record " + path + " is not a regular file of at most 1 MiB");
    }
    std::string text(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t got = 0;
    while (got < text.size()) {
        const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
    }
    text.resize(got);
    auto record = record_from_json(text);
    if (!record)
        return make_error(errc::backend_failure, record.error().detail + " (" + path + ")");
    if (record->id != id) {
        return make_error(errc::backend_failure, "sandbox record " + path + " names another id");
    }
    return record;
}

std::vector<std::string> sandbox_records::ids(std::size_t limit) const {
    std::vector<std::string> out;
    const std::string dir = wire::sandboxes_dir(state_dir_);
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return out;
    while (dirent* entry = ::readdir(d)) {
        const std::string_view name = entry->d_name;
        if (!name.ends_with(".json")) continue;
        const std::string_view id = name.substr(0, name.size() - 5);
        if (!valid_record_id(id)) continue;
        out.emplace_back(id);
        if (out.size() >= limit) break;
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

void sandbox_records::remove(std::string_view id) const {
    if (!valid_record_id(id)) return;
    ::unlink(socket_path(id).c_str());
    ::unlink(egress_meter_path(id).c_str());
    ::unlink(wire::record_path(state_dir_, id).c_str());
}

std::uint64_t process_start_ticks(int pid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
    unique_fd fd(::open(path, O_RDONLY | O_CLOEXEC));
    if (!fd.is_open()) return 0;
    char text[1024];
    const ssize_t n = ::read(fd.get(), text, sizeof text - 1);
    if (n <= 0) return 0;
    text[n] = '\0';
    const char* p = std::strrchr(text, ')');
    // The state follows the command name: a zombie has exited.
    if (p == nullptr || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X') return 0;
    for (int field = 2; field < 22 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
    std::uint64_t ticks = 0;
    if (p != nullptr) std::from_chars(p + 1, text + n, ticks);
    return ticks;
}

result<unique_fd> open_live_init(const sandbox_record& record) {
    if (record.init_pid <= 0) {
        return make_error(errc::sandbox_unavailable,
                          "sandbox " + record.id +
                              " is still being created (or its creator died "
                              "mid-create)");
    }
    // The pidfd first, the start time second: if the start time still matches afterwards, the
    // pidfd refers to the sandbox's pid 1, whatever happens to the pid later.
    unique_fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, record.init_pid, 0)));
    const bool same_process =
        pidfd.is_open() && process_start_ticks(record.init_pid) == record.init_start_ticks;
    pollfd exited{pidfd.get(), POLLIN, 0};
    if (!same_process || ::poll(&exited, 1, 0) != 0) {
        const bool expired = std::chrono::system_clock::now() >= record.expires_at;
        return make_error(
            errc::sandbox_unavailable,
            "sandbox " + record.id +
                (expired ? " has ended: its TTL expired" : " has ended: its pid 1 exited"));
    }
    return pidfd;
}

bool init_is_gone(const sandbox_record& record) {
    if (record.init_pid <= 0) return false;
    unique_fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, record.init_pid, 0)));
    if (!pidfd.is_open()) return errno == ESRCH;
    pollfd exited{pidfd.get(), POLLIN, 0};
    if (::poll(&exited, 1, 0) == 1) return true;
    // Alive (or a zombie, which reads as 0): the pid is the record's only if it started then.
    const std::uint64_t ticks = process_start_ticks(record.init_pid);
    return ticks != 0 && ticks != record.init_start_ticks;
}

void thaw_v1_commands(const sandbox_record& record) {
    for (const auto& dir : record.cgroups) {
        const std::string state = dir + "/commands/freezer.state";
        if (const int fd = ::open(state.c_str(), O_WRONLY | O_CLOEXEC); fd >= 0) {
            (void)!::write(fd, "THAWED", 6);
            ::close(fd);
        }
    }
}

int remove_cgroups(const sandbox_record& record) {
    thaw_v1_commands(record);
    int first = 0;
    for (const auto& dir : record.cgroups) {
        const int err = remove_cgroup_tree(dir);
        if (err != 0 && first == 0) first = err;
    }
    return first;
}

sandbox_info describe_record(const sandbox_record& r) {
    sandbox_info info;
    info.id = r.id;
    info.labels = r.labels;
    info.created_at = r.created_at;
    info.expires_at = r.expires_at;
    if (r.paused_at) {
        info.state = sandbox_state::paused;
        info.paused_at = r.paused_at;
        info.ttl_left = r.ttl_left;
    }
    if (r.init_pid > 0) info.host_pid = r.init_pid;
    info.layers = r.layers;
    info.limits = r.limits;
    info.layout = r.layout;
    info.network = r.network;
    info.template_name =
        r.template_name.empty() ? std::string(base_template_name) : r.template_name;
    info.template_digest = r.template_digest;
    info.owner_instance = r.owner_instance;
    info.survive_owner = r.survive_owner;
    info.owned = false;
    return info;
}

}  // namespace moat
