// The E2B protocol's codecs (src/e2b_protocol): every wire type written by its writer and read
// back by its parser, in each direction the two sides use (the e2b backend's clients write
// requests and read replies, moat serve the other way round), and the one base64 and
// percent-encoding in src/core they rest on.
#include "core/ascii.hpp"
#include "core/base64.hpp"
#include "core/json_writer.hpp"
#include "e2b_protocol/code_interpreter_messages.hpp"
#include "e2b_protocol/error_body.hpp"
#include "e2b_protocol/filesystem_messages.hpp"
#include "e2b_protocol/process_messages.hpp"
#include "e2b_protocol/sandbox_replies.hpp"
#include "e2b_protocol/sandbox_requests.hpp"
#include "e2b_protocol/watch_messages.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <ostream>  // doctest prints std::error_code through it
#include <string>
#include <vector>

namespace {

namespace protocol = moat::e2b_protocol;
using moat::errc;
using std::chrono::system_clock;

// Every byte value, for the fields that must carry any byte.
std::string every_byte() {
    std::string out;
    for (int i = 0; i < 256; ++i) out.push_back(static_cast<char>(i));
    return out;
}

// A time with whole milliseconds (what E2B's timestamps carry).
system_clock::time_point at_ms(std::int64_t ms) {
    return system_clock::time_point(std::chrono::milliseconds(ms));
}

}  // namespace

TEST_CASE("e2b protocol: a create request round-trips, with and without its optional fields") {
    protocol::create_request full;
    full.template_id = "base";
    full.timeout_s = 120;
    full.metadata = {{"user", "a b&c=d"}, {"k", "v\n\"quoted\""}};
    full.env_vars = {{"PATH", "/bin"}, {"EMPTY", ""}};
    full.auto_pause = true;
    full.auto_resume = true;
    full.secure = true;
    full.allow_internet_access = false;
    full.network = protocol::network_request{
        {"pypi.org", "*.pythonhosted.org"}, {"0.0.0.0/0"}, false, "h-${PORT}.example"};
    auto back = protocol::parse_create_request(protocol::encode_create_request(full));
    REQUIRE_MESSAGE(back, back.error().to_string());
    CHECK(back->template_id == full.template_id);
    CHECK(back->timeout_s == full.timeout_s);
    CHECK(back->metadata == full.metadata);
    CHECK(back->env_vars == full.env_vars);
    CHECK(back->auto_pause);
    CHECK(back->auto_resume == true);
    CHECK(back->secure == true);
    CHECK(back->allow_internet_access == false);
    REQUIRE(back->network);
    CHECK(back->network->allow_out == full.network->allow_out);
    CHECK(back->network->deny_out == full.network->deny_out);
    CHECK(back->network->allow_public_traffic == false);
    CHECK(back->network->mask_request_host == "h-${PORT}.example");

    protocol::create_request bare;
    auto plain = protocol::parse_create_request(protocol::encode_create_request(bare));
    REQUIRE(plain);
    CHECK(plain->template_id.empty());
    CHECK_FALSE(plain->timeout_s);
    CHECK_FALSE(plain->auto_pause);
    CHECK_FALSE(plain->auto_resume);
    CHECK_FALSE(plain->secure);
    CHECK_FALSE(plain->allow_internet_access);
    CHECK_FALSE(plain->network);
}

TEST_CASE("e2b protocol: a create request's autoResume is {enabled: bool}, as the SDK sends it") {
    auto off = protocol::parse_create_request(R"({"autoResume":{"enabled":false}})");
    REQUIRE(off);
    CHECK(off->auto_resume == false);
    for (const char* body : {R"({"autoResume":true})", R"({"autoResume":{}})",
                             R"({"autoResume":{"enabled":"yes"}})"}) {
        auto refused = protocol::parse_create_request(body);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().detail.find("autoResume") != std::string::npos);
    }
}

TEST_CASE("e2b protocol: the timeout, connect and refresh bodies round-trip") {
    CHECK(protocol::parse_timeout_request(protocol::encode_timeout_request(0)).value() == 0);
    CHECK(protocol::parse_timeout_request(protocol::encode_timeout_request(3600)).value() == 3600);
    auto connect = protocol::parse_connect_request(protocol::encode_connect_request(90));
    REQUIRE(connect);
    CHECK(*connect == std::optional<std::int64_t>(90));
    auto no_timeout = protocol::parse_connect_request(protocol::encode_connect_request({}));
    REQUIRE(no_timeout);
    CHECK_FALSE(no_timeout->has_value());
    auto refresh = protocol::parse_refresh_request(protocol::encode_refresh_request(60));
    REQUIRE(refresh);
    CHECK(*refresh == std::optional<std::int64_t>(60));
    auto no_duration = protocol::parse_refresh_request(protocol::encode_refresh_request({}));
    REQUIRE(no_duration);
    CHECK_FALSE(no_duration->has_value());
}

TEST_CASE("e2b protocol: a list request and its label filter round-trip through the query") {
    protocol::list_request request;
    request.metadata = {{"owner", "a b&c=d%"}, {"z", every_byte()}};
    request.state = "running,paused";
    request.order = "asc";
    request.limit = 7;
    request.template_id = "base";
    request.started_after = at_ms(1'790'000'000'123);
    request.next_token = "MTIzX19hYmM=";
    auto back = protocol::parse_list_request(protocol::encode_list_request(request), true);
    REQUIRE_MESSAGE(back, back.error().to_string());
    CHECK(back->metadata == request.metadata);
    CHECK(back->state == request.state);
    CHECK(back->order == request.order);
    CHECK(back->limit == request.limit);
    CHECK(back->template_id == request.template_id);
    CHECK(back->started_after == request.started_after);
    CHECK(back->next_token == request.next_token);
    // GET /sandboxes (v1) reads the filter only.
    auto v1 = protocol::parse_list_request(protocol::encode_list_request(request), false);
    REQUIRE(v1);
    CHECK(v1->metadata == request.metadata);
    CHECK(v1->state.empty());
    CHECK_FALSE(v1->limit);
    // The filter alone, as the SDK sends it after "metadata=".
    const std::map<std::string, std::string> filter = {{"user", "a b&c=d"}};
    auto query = protocol::parse_query("metadata=" + protocol::encode_metadata_filter(filter));
    REQUIRE(query);
    auto pairs = protocol::parse_metadata_filter(query->at("metadata"));
    REQUIRE(pairs);
    CHECK(*pairs == std::vector<std::pair<std::string, std::string>>{{"user", "a b&c=d"}});
}

TEST_CASE("e2b protocol: Sandbox, SandboxDetail and ListedSandbox round-trip") {
    protocol::sandbox_reply reply;
    reply.sandbox_id = "i0123456789abcdef";
    reply.template_id = "base";
    reply.alias = "base";
    reply.client_id = std::string(protocol::e2b_client_id);
    reply.envd_version = "0.6.4";
    reply.envd_access_token = "token-value";
    auto sandbox = protocol::parse_sandbox_reply(protocol::encode_sandbox_reply(reply));
    REQUIRE_MESSAGE(sandbox, sandbox.error().to_string());
    CHECK(sandbox->sandbox_id == reply.sandbox_id);
    CHECK(sandbox->template_id == reply.template_id);
    CHECK(sandbox->alias == reply.alias);
    CHECK(sandbox->client_id == reply.client_id);
    CHECK(sandbox->envd_version == reply.envd_version);
    CHECK(sandbox->envd_access_token == reply.envd_access_token);
    CHECK(sandbox->domain.empty());                // written as null
    CHECK(sandbox->traffic_access_token.empty());  // written as null: public ports
    reply.domain = "sandboxes.example.com";
    reply.traffic_access_token = "traffic-token";
    auto with_domain = protocol::parse_sandbox_reply(protocol::encode_sandbox_reply(reply));
    REQUIRE(with_domain);
    CHECK(with_domain->domain == reply.domain);
    CHECK(with_domain->traffic_access_token == reply.traffic_access_token);

    protocol::sandbox_detail detail;
    detail.sandbox_id = "iabc";
    detail.template_id = "base";
    detail.alias = "base";
    detail.client_id = std::string(protocol::e2b_client_id);
    detail.started_at = at_ms(1'790'000'000'123);
    detail.end_at = at_ms(1'790'000'300'456);
    detail.state = "running";
    detail.cpu_count = 2;
    detail.memory_mb = 512;
    detail.disk_size_mb = 1024;
    detail.envd_version = "0.6.4";
    detail.metadata = {{"k", "v"}};
    detail.envd_access_token = "t";
    detail.allow_internet_access = true;
    detail.allow_out = {"pypi.org"};
    detail.deny_out = {"0.0.0.0/0"};
    const auto same = [](const protocol::sandbox_detail& a, const protocol::sandbox_detail& b) {
        CHECK(a.sandbox_id == b.sandbox_id);
        CHECK(a.template_id == b.template_id);
        CHECK(a.alias == b.alias);
        CHECK(a.client_id == b.client_id);
        CHECK(a.started_at == b.started_at);
        CHECK(a.end_at == b.end_at);
        CHECK(a.state == b.state);
        CHECK(a.cpu_count == b.cpu_count);
        CHECK(a.memory_mb == b.memory_mb);
        CHECK(a.disk_size_mb == b.disk_size_mb);
        CHECK(a.envd_version == b.envd_version);
        CHECK(a.metadata == b.metadata);
    };
    auto got = protocol::parse_sandbox_detail(protocol::encode_sandbox_detail(detail));
    REQUIRE_MESSAGE(got, got.error().to_string());
    same(*got, detail);
    CHECK(got->envd_access_token == detail.envd_access_token);
    CHECK(got->network_reported);
    CHECK(got->allow_internet_access == true);
    CHECK(got->allow_out == detail.allow_out);
    CHECK(got->deny_out == detail.deny_out);

    auto listed = protocol::parse_sandbox_list(protocol::encode_sandbox_list({detail, detail}));
    REQUIRE_MESSAGE(listed, listed.error().to_string());
    REQUIRE(listed->size() == 2);
    same(listed->front(), detail);
    // A ListedSandbox has no token and no egress.
    CHECK(listed->front().envd_access_token.empty());
    CHECK_FALSE(listed->front().network_reported);
    CHECK_FALSE(listed->front().allow_internet_access);
    CHECK(listed->front().allow_out.empty());
}

TEST_CASE("e2b protocol: the Error body round-trips, and each client makes its message one line") {
    protocol::error_body body;
    body.code = 502;
    body.message = "The sandbox was not found";
    body.sandbox_id = "iabc";
    auto back = protocol::parse_error_body(protocol::encode_error_body(body));
    REQUIRE(back);
    CHECK(back->code == 502);
    CHECK(back->message == body.message);
    CHECK(back->sandbox_id == body.sandbox_id);
    body.sandbox_id.reset();
    CHECK(protocol::encode_error_body(body) ==
          R"({"code":502,"message":"The sandbox was not found"})");
    body.message = "first\nsecond";
    CHECK(protocol::parse_error_message(protocol::encode_error_body(body)) == "firstsecond");
    CHECK(protocol::parse_envd_error_message(protocol::encode_error_body(body)) == "first");
}

TEST_CASE("e2b protocol: request parsers answer invalid_argument, reply parsers protocol_error") {
    for (const auto& refused : {protocol::parse_create_request("[]").error(),
                                protocol::parse_timeout_request("{}").error(),
                                protocol::parse_start_request("{}").error(),
                                protocol::parse_selector_request("{}").error(),
                                protocol::parse_list_dir_request("7").error(),
                                protocol::parse_list_request("limit=x", true).error()}) {
        CHECK(refused.code == errc::invalid_argument);
    }
    for (const auto& refused :
         {protocol::parse_sandbox_reply("{}").error(), protocol::parse_sandbox_detail("[]").error(),
          protocol::parse_sandbox_list("{}").error(), protocol::parse_process_event("{}").error(),
          protocol::parse_list_response("[]").error(),
          protocol::parse_entry_response("{}").error()}) {
        CHECK(refused.code == errc::protocol_error);
    }
    CHECK(protocol::is_valid_sandbox_id("i0abc-6532622b"));
    CHECK_FALSE(protocol::is_valid_sandbox_id("../etc"));
    CHECK_FALSE(protocol::is_valid_sandbox_id(""));
}

TEST_CASE("e2b protocol: the process service's requests round-trip") {
    protocol::start_request start;
    start.process.cmd = "/bin/bash";
    start.process.args = {"-l", "-c", "echo 'hi there'"};
    start.process.envs = {{"A", "1"}, {"B", "two words"}};
    start.process.cwd = "/home/user";
    start.tag = "moat-0123";
    start.stdin_open = false;
    auto started = protocol::parse_start_request(protocol::encode_start_request(start));
    REQUIRE_MESSAGE(started, started.error().to_string());
    CHECK(started->process.cmd == start.process.cmd);
    CHECK(started->process.args == start.process.args);
    CHECK(started->process.envs == start.process.envs);
    CHECK(started->process.cwd == start.process.cwd);
    CHECK(started->tag == start.tag);
    CHECK_FALSE(started->stdin_open);
    CHECK_FALSE(started->has_pty);
    start.has_pty = true;
    start.tag.reset();
    start.process.cwd.clear();
    auto pty = protocol::parse_start_request(protocol::encode_start_request(start));
    REQUIRE(pty);
    CHECK(pty->has_pty);
    CHECK_FALSE(pty->tag);
    CHECK(pty->process.cwd.empty());
    CHECK(pty->pty.cols == 0);
    start.pty = {132, 40};
    auto sized = protocol::parse_start_request(protocol::encode_start_request(start));
    REQUIRE(sized);
    CHECK(sized->pty.cols == 132);
    CHECK(sized->pty.rows == 40);
    auto too_wide = protocol::parse_start_request(
        R"({"process":{"cmd":"bash"},"pty":{"size":{"cols":5000,"rows":24}}})");
    REQUIRE_FALSE(too_wide);
    CHECK(too_wide.error().detail.find("pty.size.cols") != std::string::npos);
    auto resize = protocol::parse_update_request(
        R"({"process":{"pid":7},"pty":{"size":{"cols":"90","rows":30}}})");
    REQUIRE(resize);
    CHECK(resize->has_pty);
    CHECK(resize->pty.cols == 90);
    CHECK(resize->pty.rows == 30);
    CHECK(protocol::encode_pty_data_event("hi\n") == R"({"event":{"data":{"pty":"aGkK"}}})");

    protocol::process_selector by_pid;
    by_pid.pid = 4242;
    auto pid = protocol::parse_selector_request(protocol::encode_selector_request(by_pid));
    REQUIRE(pid);
    CHECK(pid->pid == 4242u);
    CHECK_FALSE(pid->tag);
    protocol::process_selector by_tag;
    by_tag.tag = "job";
    auto tag = protocol::parse_selector_request(protocol::encode_selector_request(by_tag));
    REQUIRE(tag);
    CHECK(tag->tag == "job");
    CHECK_FALSE(tag->pid);

    for (const bool is_pty : {false, true}) {
        protocol::send_input_request input;
        input.process = by_pid;
        input.bytes = every_byte();
        input.is_pty = is_pty;
        auto sent = protocol::parse_send_input_request(protocol::encode_send_input_request(input));
        REQUIRE(sent);
        CHECK(sent->process.pid == 4242u);
        CHECK(sent->bytes == input.bytes);
        CHECK(sent->is_pty == is_pty);
    }

    for (const int number : {SIGKILL, SIGTERM}) {
        protocol::send_signal_request signal;
        signal.process = by_tag;
        signal.signal = number;
        const auto json = protocol::encode_send_signal_request(signal);
        REQUIRE(json);
        auto back = protocol::parse_send_signal_request(*json);
        REQUIRE(back);
        CHECK(back->process.tag == "job");
        CHECK(back->signal == number);
    }
    protocol::send_signal_request interrupt;
    interrupt.process = by_pid;
    interrupt.signal = SIGINT;
    CHECK_FALSE(protocol::encode_send_signal_request(interrupt));
}

TEST_CASE("e2b protocol: the process stream's events and List's response round-trip") {
    auto start = protocol::parse_process_event(protocol::encode_start_event(77));
    REQUIRE(start);
    CHECK(std::get<protocol::start_event>(*start).pid == 77u);
    for (const auto channel : {moat::output_channel::out, moat::output_channel::err}) {
        auto data =
            protocol::parse_process_event(protocol::encode_data_event(channel, every_byte()));
        REQUIRE(data);
        CHECK(std::get<protocol::data_event>(*data).channel == channel);
        CHECK(std::get<protocol::data_event>(*data).bytes == every_byte());
    }
    protocol::end_event exited{3, true, "exit status 3", "exit status 3"};
    protocol::end_event clean{0, true, "exit status 0", std::nullopt};
    protocol::end_event killed{-1, false, "signal: killed", "signal: killed"};
    for (const auto& end : {exited, clean, killed}) {
        auto back = protocol::parse_process_event(protocol::encode_end_event(end));
        REQUIRE(back);
        const auto& got = std::get<protocol::end_event>(*back);
        CHECK(got.exit_code == end.exit_code);
        CHECK(got.exited == end.exited);
        CHECK(got.status == end.status);
        CHECK(got.error == end.error);
    }
    CHECK(protocol::result_from_end(killed).signal == SIGKILL);
    auto keepalive = protocol::parse_process_event(protocol::encode_keepalive_event());
    REQUIRE(keepalive);
    CHECK(std::holds_alternative<protocol::keepalive_event>(*keepalive));

    protocol::listed_process tagged;
    tagged.pid = 9;
    tagged.config = {"python3", {"-c", "print(1)"}, {{"X", "y"}}, "/tmp"};
    tagged.tag = "moat-1";
    protocol::listed_process untagged;
    untagged.pid = 10;
    untagged.config.cmd = "sleep";
    auto list = protocol::parse_list_response(protocol::encode_list_response({tagged, untagged}));
    REQUIRE_MESSAGE(list, list.error().to_string());
    REQUIRE(list->size() == 2);
    CHECK((*list)[0].pid == 9u);
    CHECK((*list)[0].tag == "moat-1");
    CHECK((*list)[0].config.cmd == "python3");
    CHECK((*list)[0].config.args == tagged.config.args);
    CHECK((*list)[0].config.envs == tagged.config.envs);
    CHECK((*list)[0].config.cwd == "/tmp");
    CHECK((*list)[1].pid == 10u);
    CHECK_FALSE((*list)[1].tag);
}

TEST_CASE("e2b protocol: EntryInfo, its replies and the filesystem requests round-trip") {
    protocol::entry_info entry;
    entry.name = "a file \"quoted\"";
    entry.type = protocol::entry_type::file;
    entry.path = "/home/user/a file \"quoted\"";
    entry.size = 1234567890123;
    entry.mode = 04755;
    entry.permissions = "-rwsr-xr-x";
    entry.owner = "user";
    entry.group = "user";
    entry.modified_seconds = 1'790'000'000;
    entry.modified_nanos = 123456789;
    entry.metadata = {{"label", "value"}};
    protocol::entry_info link;
    link.name = "link";
    link.type = protocol::entry_type::directory;
    link.path = "/home/user/link";
    link.symlink_target = "/home/user/dir";
    const auto same = [](const protocol::entry_info& a, const protocol::entry_info& b) {
        CHECK(a.name == b.name);
        CHECK(a.type == b.type);
        CHECK(a.path == b.path);
        CHECK(a.size == b.size);
        CHECK(a.mode == b.mode);
        CHECK(a.permissions == b.permissions);
        CHECK(a.owner == b.owner);
        CHECK(a.group == b.group);
        CHECK(a.modified_seconds == b.modified_seconds);
        CHECK(a.modified_nanos == b.modified_nanos);
        CHECK(a.symlink_target == b.symlink_target);
        CHECK(a.metadata == b.metadata);
    };
    auto stat = protocol::parse_entry_response(protocol::encode_entry_response(entry));
    REQUIRE_MESSAGE(stat, stat.error().to_string());
    same(*stat, entry);
    CHECK(protocol::to_file_type(stat->type) == moat::file_type::regular);
    auto listing =
        protocol::parse_list_dir_response(protocol::encode_list_dir_response({entry, link}), 2);
    REQUIRE_MESSAGE(listing, listing.error().to_string());
    REQUIRE(listing->size() == 2);
    same((*listing)[0], entry);
    same((*listing)[1], link);
    auto over =
        protocol::parse_list_dir_response(protocol::encode_list_dir_response({entry, link}), 1);
    REQUIRE_FALSE(over);
    CHECK(over.error().code == errc::too_large);

    CHECK(protocol::parse_path_request(protocol::encode_path_request("~/a b")).value() == "~/a b");
    auto list_dir = protocol::parse_list_dir_request(protocol::encode_list_dir_request({"/x", 3}));
    REQUIRE(list_dir);
    CHECK(list_dir->path == "/x");
    CHECK(list_dir->depth == 3u);
    auto move = protocol::parse_move_request(protocol::encode_move_request({"/a", "/b c"}));
    REQUIRE(move);
    CHECK(move->source == "/a");
    CHECK(move->destination == "/b c");

    protocol::files_query query;
    query.path = "/home/user/a&b=c d%.txt";
    query.username = "user";
    query.signature = "v1_abc+/";
    auto parsed = protocol::parse_files_query(protocol::encode_files_query(query));
    REQUIRE(parsed);
    CHECK(parsed->path == query.path);
    CHECK(parsed->username == query.username);
    CHECK(parsed->signature == query.signature);
    CHECK_FALSE(parsed->signature_expiration);
}

TEST_CASE("one base64 and one percent-encoding: both alphabets, each padding rule, every byte") {
    const auto bytes = every_byte();
    for (std::size_t n = 0; n < 5; ++n) {
        const auto text = bytes.substr(0, n) + bytes;
        CHECK(moat::base64_decode(moat::base64_encode(text)) == text);
        CHECK(moat::base64_decode(moat::base64_encode(text), moat::base64_padding::required) ==
              text);
        CHECK(moat::base64url_decode(moat::base64url_encode(text)) == text);
    }
    CHECK(moat::base64_encode("user:") == "dXNlcjo=");
    CHECK(moat::base64url_encode("\xfb\xff") == "-_8");
    // Padding required: whole quartets, no whitespace.
    CHECK_FALSE(moat::base64_decode("dXNlcjo", moat::base64_padding::required));
    CHECK_FALSE(moat::base64_decode("dXNl cjo=", moat::base64_padding::required));
    CHECK(moat::base64_decode("dXNlcjo") == std::optional<std::string>("user:"));
    CHECK_FALSE(moat::base64url_decode("a+b/"));
    CHECK_FALSE(moat::base64url_decode("a"));
    const auto encoded = moat::detail::percent_encoded(bytes);
    CHECK(encoded.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                    "0123456789-._~%") == std::string::npos);
    CHECK(moat::detail::percent_decoded(encoded, false) == bytes);
}

TEST_CASE("e2b code interpreter: requests parse as the SDK sends them, bad ones name the field") {
    auto full = protocol::parse_execute_request(
        R"({"code":"x = 1\nx","context_id":"c1","env_vars":{"A":"1","B":""}})");
    REQUIRE_MESSAGE(full, full.error().to_string());
    CHECK(full->code == "x = 1\nx");
    CHECK(full->context_id == "c1");
    CHECK(full->language.empty());
    CHECK(full->env_vars == std::map<std::string, std::string>{{"A", "1"}, {"B", ""}});
    auto back = protocol::parse_execute_request(protocol::encode_execute_request(*full));
    REQUIRE(back);
    CHECK(back->code == full->code);
    CHECK(back->env_vars == full->env_vars);
    // JSON.stringify drops undefined fields; null is absent too.
    auto bare = protocol::parse_execute_request(R"({"code":"1+1","language":null})");
    REQUIRE(bare);
    CHECK(bare->language.empty());
    for (const auto* bad :
         {R"({"code":1})", R"({})", R"([])", R"({"code":"x","env_vars":[]})",
          R"({"code":"x","env_vars":{"A":1}})", R"({"code":"x","language":3})", "not json"}) {
        CAPTURE(bad);
        auto refused = protocol::parse_execute_request(bad);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
    }
    CHECK(protocol::normalize_language("") == "python");
    CHECK(protocol::normalize_language(" JS ") == "javascript");
    CHECK(protocol::normalize_language("ts") == "typescript");
    CHECK(protocol::normalize_language("Bash") == "bash");
    CHECK(protocol::normalize_language(std::string(65, 'x')).empty());

    auto context = protocol::parse_context_request(R"({"language":"js","cwd":"/tmp"})");
    REQUIRE(context);
    CHECK(context->language == "js");
    CHECK(context->cwd == "/tmp");
    auto empty = protocol::parse_context_request("");
    REQUIRE(empty);
    CHECK(empty->language.empty());
    CHECK_FALSE(protocol::parse_context_request(R"({"cwd":5})"));
    CHECK(protocol::encode_context_list({{"a", "python", "/home/user"}}) ==
          R"([{"id":"a","language":"python","cwd":"/home/user"}])");
}

TEST_CASE(
    "e2b code interpreter: an execution's lines are one JSON object each, as the SDK reads "
    "them") {
    const auto out = protocol::encode_stream_line(true, "line\n", {});
    CHECK(out.starts_with(R"({"type":"stderr","text":"line\n","timestamp":")"));
    CHECK(out.ends_with("\"}\n"));
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    const auto result = protocol::encode_result_line({{"text/plain", "'hello'"},
                                                      {"text/html", "<b>hi</b>"},
                                                      {"image/png", "iVBORw0KGgo="},
                                                      {"application/json", "{\n  \"a\": [1, 2]\n}"},
                                                      {"application/x-custom", "z"}},
                                                     true);
    CHECK(
        result ==
        R"({"type":"result","text":"hello","html":"<b>hi</b>","png":"iVBORw0KGgo=","json":{"a":[1,2]},"application/x-custom":"z","is_main_result":true})"
        "\n");
    // JSON that is not an object stays a string; the line's own keys cannot be overwritten.
    CHECK(protocol::encode_result_line({{"application/json", "[1]"}, {"type", "x"}}, false) ==
          R"({"type":"result","json":"[1]","is_main_result":false})"
          "\n");
    CHECK(
        protocol::encode_error_line("ZeroDivisionError", "division by zero", "Traceback...") ==
        R"({"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback..."})"
        "\n");
    CHECK(protocol::encode_execution_count_line(3) ==
          R"({"type":"number_of_executions","execution_count":3})"
          "\n");
    CHECK(protocol::encode_end_line() == "{\"type\":\"end_of_execution\"}\n");
}

TEST_CASE(
    "envd watches: WatchDir and watcher requests parse as the SDK sends them, events as envd") {
    auto full =
        protocol::parse_watch_dir_request(R"({"path":"w","recursive":true,"includeEntry":false})");
    REQUIRE(full);
    CHECK(full->path == "w");
    CHECK(full->recursive);
    CHECK_FALSE(full->include_entry);
    auto bare = protocol::parse_watch_dir_request("{}");
    REQUIRE(bare);
    CHECK(bare->path.empty());
    CHECK_FALSE(bare->recursive);
    auto bad = protocol::parse_watch_dir_request(R"({"recursive":"yes"})");
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == errc::invalid_argument);
    CHECK(bad.error().detail.find("recursive") != std::string::npos);
    CHECK_FALSE(protocol::parse_watch_dir_request("[]"));
    CHECK(protocol::encode_watch_start() == R"({"start":{}})");
    CHECK(protocol::encode_watch_keepalive() == R"({"keepalive":{}})");
    protocol::filesystem_event event{{"a/b", moat::watch_event_type::chmod, false}, {}};
    CHECK(protocol::encode_watch_event(event) ==
          R"({"filesystem":{"name":"a/b","type":"EVENT_TYPE_CHMOD"}})");
    // includeEntry: the entry follows the type, written as Stat's EntryInfo.
    protocol::entry_info entry;
    entry.name = "b";
    entry.type = protocol::entry_type::file;
    entry.path = "/home/user/a/b";
    entry.size = 3;
    entry.mode = 0644;
    entry.permissions = "-rw-r--r--";
    entry.owner = "user";
    entry.group = "user";
    event.entry = entry;
    CHECK(protocol::encode_watch_event(event) ==
          R"({"filesystem":{"name":"a/b","type":"EVENT_TYPE_CHMOD","entry":{"name":"b",)"
          R"("type":"FILE_TYPE_FILE","path":"/home/user/a/b","size":"3","mode":420,)"
          R"("permissions":"-rw-r--r--","owner":"user","group":"user"}}})");
    CHECK(protocol::encode_create_watcher_response("w01") == R"({"watcherId":"w01"})");
    auto id = protocol::parse_watcher_id_request(R"({"watcherId":"w01"})");
    REQUIRE(id);
    CHECK(*id == "w01");
    CHECK_FALSE(protocol::parse_watcher_id_request(R"({"watcherId":1})"));
    std::vector<protocol::filesystem_event> events = {
        {{"f", moat::watch_event_type::create, false}, {}},
        {{"f", moat::watch_event_type::remove, false}, {}}};
    CHECK(protocol::encode_watcher_events_response(events) ==
          R"({"events":[{"name":"f","type":"EVENT_TYPE_CREATE"},)"
          R"({"name":"f","type":"EVENT_TYPE_REMOVE"}]})");
    CHECK(protocol::encode_watcher_events_response({}) == R"({"events":[]})");
}
