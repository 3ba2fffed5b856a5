// The JSON a model reads for a tool call, and the media types of artifacts.
#include <moat/tools.hpp>

#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <string_view>

using namespace std::chrono_literals;

namespace {

// Parses `json` (which must be valid) and returns the top-level object's keys in order.
std::string keys_of(const std::string& json) {
    simdjson::dom::parser parser;
    simdjson::dom::object object;
    const auto error = parser.parse(json).get(object);
    REQUIRE_MESSAGE(!error, json);
    std::string keys;
    for (auto field : object) {
        if (!keys.empty()) keys += ',';
        keys += std::string(field.key);
    }
    return keys;
}

moat::tool_result python_error() {
    moat::tool_result r;
    r.tool = "run_python";
    r.status = moat::tool_status::error;
    r.exit_code = 1;
    r.stdout_text = "loading \"prices.csv\"\n";
    r.stderr_text =
        "Traceback (most recent call last):\n  File \"<cell 3>\", line 2\n"
        "KeyError: 'price'\n";
    r.duration = 42ms;
    r.error_type = "KeyError";
    r.traceback = r.stderr_text;
    r.message = "KeyError: 'price'";
    r.hint = "print df.columns to see which columns exist";
    return r;
}

}  // namespace

TEST_CASE("tool statuses have stable names") {
    CHECK(std::string_view(moat::to_string(moat::tool_status::ok)) == "ok");
    CHECK(std::string_view(moat::to_string(moat::tool_status::error)) == "error");
    CHECK(std::string_view(moat::to_string(moat::tool_status::timeout)) == "timeout");
    CHECK(std::string_view(moat::to_string(moat::tool_status::unavailable)) == "unavailable");
}

TEST_CASE("a Python error renders its streams, exception and hint in a fixed order") {
    const std::string json = python_error().to_json();
    CHECK(keys_of(json) ==
          "status,exit_code,stdout,stderr,truncated,duration_ms,error_type,traceback,message,hint");
    CHECK(json.find('\n') == std::string::npos);
    CHECK(json.starts_with(
        R"({"status":"error","exit_code":1,"stdout":"loading \"prices.csv\"\n",)"));

    simdjson::dom::parser parser;
    simdjson::dom::element root;
    REQUIRE(!parser.parse(json).get(root));
    CHECK(std::string_view(root["stdout"]) == "loading \"prices.csv\"\n");
    CHECK(std::string_view(root["stderr"]) == python_error().stderr_text);
    CHECK(int64_t(root["exit_code"]) == 1);
    CHECK(int64_t(root["duration_ms"]) == 42);
    CHECK(std::string_view(root["error_type"]) == "KeyError");
}

TEST_CASE("fields that do not apply to a tool are omitted") {
    moat::tool_result write;
    write.tool = "write_file";
    write.path = "/workspace/data.csv";
    write.bytes = 12;
    write.duration = 3ms;
    CHECK(write.to_json() ==
          R"({"status":"ok","duration_ms":3,"path":"/workspace/data.csv","bytes":12})");

    moat::tool_result read;
    read.tool = "read_file";
    read.path = "/workspace/empty.txt";
    CHECK(keys_of(read.to_json()) ==
          "status,duration_ms,path,encoding,truncated,content,bytes");  // empty file

    moat::tool_result missing = read;
    missing.status = moat::tool_status::error;
    missing.message = "no such file: /workspace/empty.txt";
    CHECK(keys_of(missing.to_json()) == "status,duration_ms,message,path");

    moat::tool_result list;
    list.tool = "list_files";
    list.path = "/workspace/empty";
    CHECK(list.to_json() ==
          R"({"status":"ok","duration_ms":0,"path":"/workspace/empty","entries":[]})");

    moat::tool_result shell;
    shell.tool = "run_shell";
    shell.exit_code = 0;
    CHECK(
        shell.to_json() ==
        R"({"status":"ok","exit_code":0,"stdout":"","stderr":"","truncated":false,"duration_ms":0})");

    moat::tool_result lost;
    lost.tool = "run_python";
    lost.status = moat::tool_status::unavailable;
    lost.message = "the sandbox could not be reached";
    lost.notices = {"the sandbox was rebuilt: files and variables are gone"};
    CHECK(lost.to_json() ==
          R"({"status":"unavailable","duration_ms":0,"message":"the sandbox could not be reached",)"
          R"("notices":["the sandbox was rebuilt: files and variables are gone"]})");
}

TEST_CASE("listings and artifacts render as arrays of objects") {
    moat::tool_result list;
    list.tool = "list_files";
    list.path = "/workspace";
    list.entries = {{"data.csv", moat::file_type::regular, 120},
                    {"out", moat::file_type::directory, 4096},
                    {"latest", moat::file_type::symlink, 8},
                    {"fifo", moat::file_type::other, 0}};
    CHECK(list.to_json() == R"({"status":"ok","duration_ms":0,"path":"/workspace","entries":[)"
                            R"({"name":"data.csv","type":"file","size":120},)"
                            R"({"name":"out","type":"directory","size":4096},)"
                            R"({"name":"latest","type":"symlink","size":8},)"
                            R"({"name":"fifo","type":"other","size":0}]})");

    moat::tool_result run = python_error();
    run.status = moat::tool_status::ok;
    run.exit_code = 0;
    run.error_type.clear();
    run.traceback.clear();
    run.message.clear();
    run.hint.clear();
    run.stderr_text.clear();
    run.artifacts = {{"plot.png", 2048, moat::media_type_for("plot.png")},
                     {"tables/summary.csv", 99, moat::media_type_for("tables/summary.csv")}};
    const std::string json = run.to_json();
    CHECK(keys_of(json) == "status,exit_code,stdout,stderr,truncated,duration_ms,artifacts");
    CHECK(json.ends_with(R"("artifacts":[{"path":"plot.png","size":2048,"media_type":"image/png"},)"
                         R"({"path":"tables/summary.csv","size":99,"media_type":"text/csv"}]})"));
}

TEST_CASE("text with quotes, backslashes, control characters and invalid UTF-8 stays valid JSON") {
    moat::tool_result r;
    r.tool = "read_file";
    r.path = "/workspace/odd \"name\".txt";
    constexpr char raw[] = "tab\tquote\" backslash\\ nul\0 bell\x07 cr\r del\x7f bad\xff end\n";
    r.content = std::string(raw, sizeof raw - 1);
    r.bytes = r.content.size();
    const std::string json = r.to_json();
    CHECK(json.find('\n') == std::string::npos);
    CHECK(json.find(R"(\"name\")") != std::string::npos);
    CHECK(json.find(R"(\u0000)") != std::string::npos);

    simdjson::dom::parser parser;
    simdjson::dom::element root;
    REQUIRE_MESSAGE(!parser.parse(json).get(root), json);
    CHECK(std::string_view(root["path"]) == r.path);
    constexpr char expected[] =
        "tab\tquote\" backslash\\ nul\0 bell\x07 cr\r del\x7f bad\xEF\xBF\xBD end\n";
    CHECK(std::string_view(root["content"]) == std::string_view(expected, sizeof expected - 1));
    CHECK(uint64_t(root["bytes"]) == sizeof raw - 1);
}

TEST_CASE("media types come from the file name's extension, in any case") {
    CHECK(moat::media_type_for("plot.png") == "image/png");
    CHECK(moat::media_type_for("out/Photo.JPG") == "image/jpeg");
    CHECK(moat::media_type_for("a.jpeg") == "image/jpeg");
    CHECK(moat::media_type_for("anim.gif") == "image/gif");
    CHECK(moat::media_type_for("chart.svg") == "image/svg+xml");
    CHECK(moat::media_type_for("x.webp") == "image/webp");
    CHECK(moat::media_type_for("report.pdf") == "application/pdf");
    CHECK(moat::media_type_for("t.csv") == "text/csv");
    CHECK(moat::media_type_for("t.tsv") == "text/tab-separated-values");
    CHECK(moat::media_type_for("notes.txt") == "text/plain");
    CHECK(moat::media_type_for("run.log") == "text/plain");
    CHECK(moat::media_type_for("README.md") == "text/markdown");
    CHECK(moat::media_type_for("d.json") == "application/json");
    CHECK(moat::media_type_for("page.html") == "text/html");
    CHECK(moat::media_type_for("page.HTM") == "text/html");
    CHECK(moat::media_type_for("d.xml") == "application/xml");
    CHECK(moat::media_type_for("c.yaml") == "application/yaml");
    CHECK(moat::media_type_for("c.yml") == "application/yaml");
    CHECK(moat::media_type_for("s.py") == "text/x-python");
    CHECK(moat::media_type_for("n.ipynb") == "application/x-ipynb+json");
    CHECK(moat::media_type_for("a.zip") == "application/zip");
    CHECK(moat::media_type_for("a.tar") == "application/x-tar");
    CHECK(moat::media_type_for("a.tar.gz") == "application/gzip");
    CHECK(moat::media_type_for("t.parquet") == "application/vnd.apache.parquet");
    CHECK(moat::media_type_for("t.xlsx") ==
          "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet");
    CHECK(moat::media_type_for("a.npy") == "application/x-npy");
    CHECK(moat::media_type_for("s.wav") == "audio/wav");
    CHECK(moat::media_type_for("s.mp3") == "audio/mpeg");
    CHECK(moat::media_type_for("v.mp4") == "video/mp4");
    // Unknown, missing or hidden-file "extensions".
    CHECK(moat::media_type_for("model.pkl") == "application/octet-stream");
    CHECK(moat::media_type_for("Makefile") == "application/octet-stream");
    CHECK(moat::media_type_for(".csv") == "application/octet-stream");
    CHECK(moat::media_type_for("dir.png/file") == "application/octet-stream");
    CHECK(moat::media_type_for("trailing.") == "application/octet-stream");
    CHECK(moat::media_type_for("") == "application/octet-stream");
}

TEST_CASE("cut output, a base64 read and file error codes render as structured fields") {
    moat::tool_result run;
    run.tool = "run_shell";
    run.exit_code = 0;
    run.stdout_omitted = 194000;
    CHECK(run.to_json() ==
          R"({"status":"ok","exit_code":0,"stdout":"","stderr":"","truncated":true,)"
          R"("omitted_chars":{"stdout":194000},"duration_ms":0})");
    run.stderr_omitted = 5;
    run.artifacts_truncated = true;
    CHECK(run.to_json().find(R"("omitted_chars":{"stdout":194000,"stderr":5})") !=
          std::string::npos);
    CHECK(run.to_json().ends_with(R"("artifacts_truncated":true})"));

    moat::tool_result read;
    read.tool = "read_file";
    read.path = "/workspace/a.txt";
    read.content = "head";
    read.content_omitted = 7;
    read.bytes = 11;
    CHECK(read.to_json() == R"({"status":"ok","duration_ms":0,"path":"/workspace/a.txt",)"
                            R"("encoding":"text","truncated":true,"omitted_chars":{"content":7},)"
                            R"("content":"head","bytes":11})");
    read.encoding = moat::file_encoding::base64;
    read.content_omitted = 0;
    read.content = "aGk=";
    CHECK(read.to_json().find(R"("encoding":"base64","truncated":false,"content":"aGk=")") !=
          std::string::npos);

    moat::tool_result missing;
    missing.tool = "read_file";
    missing.status = moat::tool_status::error;
    missing.error_code = "file_not_found";
    CHECK(keys_of(missing.to_json()) == "status,duration_ms,error_code");
    CHECK_FALSE(missing.is_tool_error());  // a missing file is a result, not moat's failure
    missing.status = moat::tool_status::unavailable;
    CHECK(missing.is_tool_error());
    moat::tool_result bad;
    bad.status = moat::tool_status::error;
    bad.argument_error = true;
    CHECK(bad.is_tool_error());
}
