#include "mcp/jsonrpc.hpp"

#include "core/json_writer.hpp"

#include <simdjson.h>

namespace moat::mcp {
namespace {

constexpr int parse_error = -32700;
constexpr int invalid_request = -32600;

jsonrpc_message invalid(int code, std::string message, std::string id = {}) {
    jsonrpc_message m;
    m.error_code = code;
    m.error_message = std::move(message);
    m.id = std::move(id);
    return m;
}

// The id as JSON text, or nullopt when it is not an integer or a string. JSON null gives "".
std::optional<std::string> id_text(simdjson::dom::element id) {
    switch (id.type()) {
        case simdjson::dom::element_type::INT64:
            return std::to_string(id.get_int64().value_unsafe());
        case simdjson::dom::element_type::UINT64:
            return std::to_string(id.get_uint64().value_unsafe());
        case simdjson::dom::element_type::STRING: {
            std::string out;
            append_json_string(out, id.get_string().value_unsafe());
            return out;
        }
        case simdjson::dom::element_type::NULL_VALUE:
            return std::string();
        default:
            return std::nullopt;
    }
}

bool is_structured(simdjson::dom::element e) {
    return e.type() == simdjson::dom::element_type::OBJECT ||
           e.type() == simdjson::dom::element_type::ARRAY;
}

// The field of a params object, or nullopt (see the header).
std::optional<simdjson::dom::element> field(simdjson::dom::parser& parser,
                                            const simdjson::padded_string& padded,
                                            std::string_view name) {
    simdjson::dom::object o;
    if (parser.parse(padded).get_object().get(o) != simdjson::SUCCESS) return std::nullopt;
    simdjson::dom::element e;
    if (o.at_key(name).get(e) != simdjson::SUCCESS) return std::nullopt;
    return e;
}

std::string_view id_or_null(std::string_view id_json) {
    return id_json.empty() ? "null" : id_json;
}

}  // namespace

jsonrpc_message parse_jsonrpc(std::string_view line, std::size_t max_bytes) {
    if (line.size() > max_bytes) return invalid(invalid_request, "message too large");
    const simdjson::padded_string padded(line);
    simdjson::dom::parser parser;
    simdjson::dom::element document;
    if (const auto error = parser.parse(padded).get(document); error != simdjson::SUCCESS) {
        return invalid(parse_error, std::string("parse error: ") + simdjson::error_message(error));
    }
    if (document.is_array()) return invalid(invalid_request, "batches are not supported");
    simdjson::dom::object o;
    if (document.get_object().get(o) != simdjson::SUCCESS) {
        return invalid(invalid_request, "a message must be a JSON object");
    }

    // The id first, so that every later error can name it.
    simdjson::dom::element id_element;
    const bool has_id = o.at_key("id").get(id_element) == simdjson::SUCCESS;
    std::string id;
    if (has_id) {
        auto text = id_text(id_element);
        if (!text) return invalid(invalid_request, "id must be an integer or a string");
        id = std::move(*text);
    }

    std::string_view version;
    if (o.at_key("jsonrpc").get_string().get(version) != simdjson::SUCCESS || version != "2.0") {
        return invalid(invalid_request, "jsonrpc must be \"2.0\"", std::move(id));
    }

    simdjson::dom::element method_element;
    if (o.at_key("method").get(method_element) == simdjson::SUCCESS) {
        std::string_view method;
        if (method_element.get_string().get(method) != simdjson::SUCCESS) {
            return invalid(invalid_request, "method must be a string", std::move(id));
        }
        if (has_id && id.empty()) {
            return invalid(invalid_request, "a request's id must not be null");
        }
        jsonrpc_message m;
        m.what = has_id ? jsonrpc_message::kind::request : jsonrpc_message::kind::notification;
        m.id = std::move(id);
        m.method.assign(method);
        simdjson::dom::element params;
        if (o.at_key("params").get(params) == simdjson::SUCCESS) {
            if (!is_structured(params)) {
                return invalid(invalid_request, "params must be an object or an array",
                               std::move(m.id));
            }
            m.params = simdjson::minify(params);
        }
        return m;
    }

    const bool has_result = o.at_key("result").error() == simdjson::SUCCESS;
    const bool has_error = o.at_key("error").error() == simdjson::SUCCESS;
    if (!has_result && !has_error) {
        return invalid(invalid_request, "method is missing", std::move(id));
    }
    if (has_result && has_error) {
        return invalid(invalid_request, "a response has a result or an error, not both",
                       std::move(id));
    }
    // A reply to a message we could not read carries a null id; only an error may do that.
    if (!has_id || (id.empty() && has_result)) {
        return invalid(invalid_request, "a response must have an id");
    }
    jsonrpc_message m;
    m.what = jsonrpc_message::kind::response;
    m.id = std::move(id);
    return m;
}

std::string jsonrpc_result(std::string_view id_json, std::string_view result_json) {
    std::string out = R"({"jsonrpc":"2.0","id":)";
    out += id_or_null(id_json);
    out += R"(,"result":)";
    out += result_json.empty() ? std::string_view("{}") : result_json;
    out += '}';
    return out;
}

std::string jsonrpc_error(std::string_view id_json, int code, std::string_view message) {
    std::string out = R"({"jsonrpc":"2.0","id":)";
    out += id_or_null(id_json);
    out += R"(,"error":{"code":)";
    out += std::to_string(code);
    out += R"(,"message":)";
    append_json_string(out, message);
    out += "}}";
    return out;
}

std::string jsonrpc_notification(std::string_view method, std::string_view params_json) {
    std::string out = R"({"jsonrpc":"2.0","method":)";
    append_json_string(out, method);
    if (!params_json.empty()) {
        out += R"(,"params":)";
        out += params_json;
    }
    out += '}';
    return out;
}

std::optional<std::string> string_field(std::string_view params_json, std::string_view name) {
    const simdjson::padded_string padded(params_json);
    simdjson::dom::parser parser;
    const auto e = field(parser, padded, name);
    std::string_view value;
    if (!e || e->get_string().get(value) != simdjson::SUCCESS) return std::nullopt;
    return std::string(value);
}

std::optional<std::string> raw_field(std::string_view params_json, std::string_view name) {
    const simdjson::padded_string padded(params_json);
    simdjson::dom::parser parser;
    const auto e = field(parser, padded, name);
    if (!e) return std::nullopt;
    return simdjson::minify(*e);
}

}  // namespace moat::mcp
