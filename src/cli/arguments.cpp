#include "cli/arguments.hpp"

#include "egress/network_policy.hpp"

#include <moat/exec.hpp>

#include <charconv>

namespace moat::cli {

std::optional<std::uint64_t> parse_unsigned(std::string_view text) {
    std::uint64_t value = 0;
    const auto* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc{} || ptr != end) return std::nullopt;
    return value;
}

std::uint64_t parse_count(std::string_view flag, std::string_view text, std::uint64_t min,
                          std::uint64_t max) {
    const auto n = parse_unsigned(text);
    if (!n || *n < min || *n > max) {
        throw usage_error(std::string(flag) + ": expected " + std::to_string(min) + " to " +
                          std::to_string(max));
    }
    return *n;
}

flag_handler string_flag(std::string_view name, std::string& into) {
    return {name, [&into](const std::string& value) { into = value; }};
}

flag_handler count_flag(std::string_view name, std::size_t& into, std::uint64_t min,
                        std::uint64_t max) {
    return {name, [name, &into, min, max](const std::string& value) {
                into = parse_count(name, value, min, max);
            }};
}

void parse_flags(int argc, char** argv, std::initializer_list<flag_handler> handlers) {
    for (int i = 0; i < argc; ++i) {
        bool matched = false;
        for (const flag_handler& h : handlers) {
            if (auto value = flag_value(h.name, argc, argv, i)) {
                h.apply(*value);
                matched = true;
                break;
            }
        }
        if (!matched) throw usage_error("unexpected argument '" + std::string(argv[i]) + "'");
    }
}

bool command_flag(int argc, char** argv, int& i, command_flags& flags) {
    const std::string_view arg = argv[i];
    if (arg == "--json") {
        flags.json = true;
    } else if (arg == "--raw") {
        flags.raw = true;
    } else if (arg == "--root") {
        flags.request.as_root = true;
    } else if (arg == "--stdin") {
        flags.read_stdin = true;
    } else if (arg == "-i" || arg == "--interactive") {
        flags.interactive = true;
    } else if (arg == "-t" || arg == "--tty") {
        flags.terminal = true;
    } else if (arg == "-it" || arg == "-ti") {
        flags.interactive = true;
        flags.terminal = true;
    } else if (auto seconds = flag_value("--timeout", argc, argv, i)) {
        flags.request.wall_limit = parse_wall_limit("--timeout", *seconds);
        flags.wall_limit_set = true;
    } else if (auto pair = flag_value("--env", argc, argv, i)) {
        auto [key, value] = parse_key_value("--env", *pair);
        flags.request.env[key] = value;
    } else {
        return false;
    }
    return true;
}

bool spec_flag(int argc, char** argv, int& i, sandbox_spec& spec) {
    if (auto megabytes = flag_value("--memory", argc, argv, i)) {
        spec.limits.memory_bytes = parse_megabytes("--memory", *megabytes);
    } else if (auto pair = flag_value("--env", argc, argv, i)) {
        auto [key, value] = parse_key_value("--env", *pair);
        spec.env[key] = value;
    } else if (auto dir = flag_value("--workdir", argc, argv, i)) {
        spec.layout.workdir = parse_absolute_path("--workdir", *dir);
    } else if (auto name = flag_value("--template", argc, argv, i)) {
        spec.template_name = *name;
    } else if (std::string_view(argv[i]) == "--allow-sudo") {
        spec.allow_sudo = true;
    } else {
        return false;
    }
    return true;
}

std::optional<std::chrono::milliseconds> parse_seconds(std::string_view text) {
    const auto dot = text.find('.');
    const auto whole = parse_unsigned(text.substr(0, dot));
    if (!whole || *whole > 1'000'000) return std::nullopt;
    std::uint64_t millis = *whole * 1000;
    if (dot != std::string_view::npos) {
        const auto fraction = text.substr(dot + 1);
        if (fraction.empty() || fraction.size() > 3 || !parse_unsigned(fraction))
            return std::nullopt;
        std::uint64_t f = *parse_unsigned(fraction);
        for (std::size_t i = fraction.size(); i < 3; ++i) f *= 10;
        millis += f;
    }
    if (millis == 0) return std::nullopt;
    return std::chrono::milliseconds(millis);
}

std::optional<std::string> flag_value(std::string_view flag, int argc, char** argv, int& i) {
    const std::string_view arg = argv[i];
    if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag && arg[flag.size()] == '=') {
        return std::string(arg.substr(flag.size() + 1));
    }
    if (arg != flag) return std::nullopt;
    if (i + 1 >= argc) throw usage_error(std::string(flag) + " needs a value");
    ++i;
    return std::string(argv[i]);
}

std::pair<std::string, std::string> parse_key_value(std::string_view flag, std::string_view text) {
    const auto eq = text.find('=');
    if (eq == 0 || eq == std::string_view::npos) {
        throw usage_error(std::string(flag) + ": expected K=V, got '" + std::string(text) + "'");
    }
    return {std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
}

std::chrono::milliseconds parse_wall_limit(std::string_view flag, const std::string& text) {
    const auto t = parse_seconds(text);
    if (!t || *t > exec_request::max_wall_limit) {
        throw usage_error(std::string(flag) + ": expected seconds between 0.001 and 600, got '" +
                          text + "'");
    }
    return *t;
}

std::string parse_absolute_path(std::string_view flag, const std::string& text) {
    if (text.empty() || text.front() != '/') {
        throw usage_error(std::string(flag) + ": expected an absolute path, got '" + text + "'");
    }
    return text;
}

std::uint64_t parse_megabytes(std::string_view flag, std::string_view text) {
    const auto mb = parse_unsigned(text);
    if (!mb || *mb < 16 || *mb > (std::uint64_t{1} << 30)) {
        throw usage_error(std::string(flag) + ": expected megabytes, at least 16, got '" +
                          std::string(text) + "'");
    }
    return *mb << 20;
}

bool network_flag(int argc, char** argv, int& i, network_flags& flags) {
    if (auto host = flag_value("--allow-host", argc, argv, i)) {
        flags.network.allow_hosts.push_back(*host);
    } else if (auto entry = flag_value("--resolve", argc, argv, i)) {
        flags.network.resolve.push_back(*entry);
    } else if (auto range = flag_value("--allow-address", argc, argv, i)) {
        flags.network.allow_addresses.push_back(*range);
    } else if (auto mode = flag_value("--network", argc, argv, i)) {
        if (*mode == "all") {
            flags.all = true;
        } else if (*mode == "none") {
            flags.none = true;
        } else {
            throw usage_error("--network: expected all or none, got '" + *mode + "'");
        }
    } else {
        return false;
    }
    return true;
}

sandbox_network finish_network(const network_flags& flags) {
    if (flags.all && flags.none) throw usage_error("--network all and --network none conflict");
    sandbox_network network = flags.network;
    if (flags.all) {
        network.mode = network_mode::all;
    } else if (!flags.none && !network.allow_hosts.empty()) {
        network.mode = network_mode::allow_list;
    } else {
        network.mode = network_mode::none;
    }
    auto policy = egress::make_network_policy(network);
    if (!policy) throw usage_error(policy.error().detail);
    return network;
}

}  // namespace moat::cli
