// libFuzzer target for the parsers of what a client sends E2B's control plane
// (src/e2b_protocol/sandbox_requests.hpp, which moat serve runs): the create, timeout, connect and
// refresh bodies, the list query and its metadata filter, RFC 3339 times and base64url page
// tokens (core/base64.hpp); and the Code Interpreter's requests and answer lines
// (src/e2b_protocol/code_interpreter_messages.hpp); and the metrics queries
// (src/e2b_protocol/sandbox_metrics.hpp); and the network update body (0xa0 to 0xaf). The first
// byte picks the parser; the rest is its input.
// What parses is written back and must parse to the same.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_e2b_request_fuzzer &&
//   build/fuzz/fuzz/moat_e2b_request_fuzzer -max_total_time=60 fuzz/corpus/e2b_request
#include "core/base64.hpp"
#include "e2b_protocol/code_interpreter_messages.hpp"
#include "e2b_protocol/sandbox_metrics.hpp"
#include "e2b_protocol/sandbox_requests.hpp"

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace protocol = moat::e2b_protocol;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

void check_create(std::string_view body) {
    auto r = protocol::parse_create_request(body);
    if (!r) {
        require(r.error().code == moat::errc::invalid_argument && !r.error().detail.empty());
        return;
    }
    require(body.size() <= protocol::max_request_body_bytes);
    require(r->metadata.size() <= protocol::max_map_entries);
    require(r->env_vars.size() <= protocol::max_map_entries);
    if (r->timeout_s) require(*r->timeout_s >= 0 && *r->timeout_s <= protocol::max_timeout_seconds);
    if (r->network) {
        for (const auto* list : {&r->network->allow_out, &r->network->deny_out}) {
            require(list->size() <= protocol::max_network_entries);
            for (const auto& entry : *list) {
                require(entry.size() <= protocol::max_network_entry_bytes);
            }
        }
    }
    // What the client's writer makes of it, the server reads back the same.
    auto again = protocol::parse_create_request(protocol::encode_create_request(*r));
    require(again.has_value());
    require(again->metadata == r->metadata && again->env_vars == r->env_vars);
    require(again->timeout_s == r->timeout_s && again->secure == r->secure);
    require(again->auto_pause == r->auto_pause && again->auto_resume == r->auto_resume);
}

void check_network_update(std::string_view body) {
    auto r = protocol::parse_network_update_request(body);
    if (!r) {
        require(r.error().code == moat::errc::invalid_argument && !r.error().detail.empty());
        return;
    }
    for (const auto* list : {&r->network.allow_out, &r->network.deny_out}) {
        require(list->size() <= protocol::max_network_entries);
        for (const auto& entry : *list) require(entry.size() <= protocol::max_network_entry_bytes);
    }
    auto again =
        protocol::parse_network_update_request(protocol::encode_network_update_request(*r));
    require(again.has_value());
    require(again->network.allow_out == r->network.allow_out);
    require(again->network.deny_out == r->network.deny_out);
    require(again->allow_internet_access == r->allow_internet_access);
}

void check_query(std::string_view query) {
    auto q = protocol::parse_query(query);
    if (!q) return;
    if (const auto it = q->find("metadata"); it != q->end()) {
        auto pairs = protocol::parse_metadata_filter(it->second);
        if (pairs) require(pairs->size() <= protocol::max_map_entries);
    }
    auto list = protocol::parse_list_request(query, true);
    if (!list) {
        require(list.error().code == moat::errc::invalid_argument);
        return;
    }
    if (list->limit) require(*list->limit >= 1 && *list->limit <= 100);
    auto again = protocol::parse_list_request(protocol::encode_list_request(*list), true);
    require(again.has_value());
    require(again->state == list->state && again->order == list->order);
    require(again->limit == list->limit && again->next_token == list->next_token);
}

void check_time(std::string_view text) {
    auto t = protocol::parse_rfc3339(text);
    if (!t) return;
    // What moat prints it parses back (to the millisecond it prints).
    const std::string printed = protocol::format_rfc3339(*t);
    auto again = protocol::parse_rfc3339(printed);
    require(again.has_value());
    require(protocol::format_rfc3339(*again) == printed);
}

void check_base64(std::string_view bytes) {
    const std::string encoded = moat::base64url_encode(bytes);
    require(moat::base64url_decode(encoded) == std::string(bytes));
    (void)moat::base64url_decode(bytes);
}

// A line of an execution's answer: one JSON object, then its one newline.
void require_one_line(const std::string& line) {
    require(!line.empty() && line.back() == '\n');
    require(line.find('\n') == line.size() - 1);
    simdjson::dom::parser parser;
    simdjson::dom::object o;
    const simdjson::padded_string padded(line);
    require(parser.parse(padded).get_object().get(o) == simdjson::SUCCESS);
}

// The Code Interpreter's requests (code_interpreter_messages.hpp), and its answer's lines made
// from the same bytes: what parses is written back and parses the same; every line is one line.
void check_code_interpreter(std::uint8_t selector, std::string_view input) {
    if (selector % 3 == 0) {
        auto r = protocol::parse_execute_request(input);
        if (!r) {
            require(r.error().code == moat::errc::invalid_argument);
            return;
        }
        require(r->env_vars.size() <= protocol::max_env_var_entries);
        auto again = protocol::parse_execute_request(protocol::encode_execute_request(*r));
        require(again && again->code == r->code && again->context_id == r->context_id &&
                again->language == r->language && again->env_vars == r->env_vars);
        (void)protocol::normalize_language(r->language);
    } else if (selector % 3 == 1) {
        auto r = protocol::parse_context_request(input);
        if (r) {
            require_one_line(protocol::encode_context({"id", r->language, r->cwd}) + "\n");
        }
    } else {
        // The input split in half: a media type and its data.
        const auto half = input.size() / 2;
        std::vector<std::pair<std::string, std::string>> reps{
            {std::string(input.substr(0, half)), std::string(input.substr(half))},
            {"application/json", std::string(input)},
            {"text/plain", std::string(input)}};
        require_one_line(protocol::encode_result_line(reps, selector & 8));
        require_one_line(protocol::encode_stream_line(selector & 16, input, {}));
        require_one_line(protocol::encode_error_line(input, input, input));
    }
}

// The metrics queries: an interval in order, the ids 1 to 100, unique and not empty; the ids
// written as the answer's keys make valid JSON.
void check_metrics(std::uint8_t selector, std::string_view input) {
    if (selector % 2 == 0) {
        auto r = protocol::parse_metrics_request(input);
        if (!r) {
            require(r.error().code == moat::errc::invalid_argument);
            return;
        }
        if (r->start && r->end) require(*r->start <= *r->end);
        return;
    }
    auto ids = protocol::parse_metrics_list_request(input);
    if (!ids) {
        require(ids.error().code == moat::errc::invalid_argument);
        return;
    }
    require(!ids->empty() && ids->size() <= protocol::max_metrics_sandboxes);
    std::map<std::string, protocol::sandbox_metric> latest;
    for (const auto& id : *ids) {
        require(!id.empty());
        require(latest.emplace(id, protocol::sandbox_metric{}).second);
    }
    const std::string json = protocol::encode_sandboxes_with_metrics(latest);
    simdjson::dom::parser parser;
    const simdjson::padded_string padded(json);
    simdjson::dom::element root;
    require(parser.parse(padded).get(root) == simdjson::SUCCESS);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
    // A first byte from 0xc0 up: the Code Interpreter's messages (below it, as before).
    if (data[0] >= 0xc0) {
        check_code_interpreter(data[0], input);
        return 0;
    }
    // From 0xb0 to 0xbf: the metrics queries.
    if (data[0] >= 0xb0) {
        check_metrics(data[0], input);
        return 0;
    }
    // From 0xa0 to 0xaf: the network update.
    if (data[0] >= 0xa0) {
        check_network_update(input);
        return 0;
    }
    switch (data[0] % 7) {
        case 0:
            check_create(input);
            break;
        case 1:
            (void)protocol::parse_timeout_request(input);
            break;
        case 2:
            (void)protocol::parse_connect_request(input);
            break;
        case 3:
            (void)protocol::parse_refresh_request(input);
            break;
        case 4:
            check_query(input);
            break;
        case 5:
            check_time(input);
            break;
        default:
            check_base64(input);
            break;
    }
    return 0;
}
