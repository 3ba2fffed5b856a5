#include <moat/tools.hpp>

#include <array>
#include <utility>

namespace moat {
namespace {

using namespace std::string_view_literals;

// Extension (lower case) -> media type. IANA-registered types where one exists.
constexpr std::array media_types{
    std::pair{"png"sv, "image/png"sv},
    std::pair{"jpg"sv, "image/jpeg"sv},
    std::pair{"jpeg"sv, "image/jpeg"sv},
    std::pair{"gif"sv, "image/gif"sv},
    std::pair{"svg"sv, "image/svg+xml"sv},
    std::pair{"webp"sv, "image/webp"sv},
    std::pair{"bmp"sv, "image/bmp"sv},
    std::pair{"tif"sv, "image/tiff"sv},
    std::pair{"tiff"sv, "image/tiff"sv},
    std::pair{"ico"sv, "image/vnd.microsoft.icon"sv},
    std::pair{"pdf"sv, "application/pdf"sv},
    std::pair{"csv"sv, "text/csv"sv},
    std::pair{"tsv"sv, "text/tab-separated-values"sv},
    std::pair{"txt"sv, "text/plain"sv},
    std::pair{"log"sv, "text/plain"sv},
    std::pair{"md"sv, "text/markdown"sv},
    std::pair{"html"sv, "text/html"sv},
    std::pair{"htm"sv, "text/html"sv},
    std::pair{"css"sv, "text/css"sv},
    std::pair{"js"sv, "text/javascript"sv},
    std::pair{"json"sv, "application/json"sv},
    std::pair{"jsonl"sv, "application/jsonl"sv},
    std::pair{"ndjson"sv, "application/x-ndjson"sv},
    std::pair{"geojson"sv, "application/geo+json"sv},
    std::pair{"xml"sv, "application/xml"sv},
    std::pair{"yaml"sv, "application/yaml"sv},
    std::pair{"yml"sv, "application/yaml"sv},
    std::pair{"toml"sv, "application/toml"sv},
    std::pair{"sql"sv, "application/sql"sv},
    std::pair{"py"sv, "text/x-python"sv},
    std::pair{"sh"sv, "text/x-shellscript"sv},
    std::pair{"ipynb"sv, "application/x-ipynb+json"sv},
    std::pair{"zip"sv, "application/zip"sv},
    std::pair{"tar"sv, "application/x-tar"sv},
    std::pair{"gz"sv, "application/gzip"sv},
    std::pair{"tgz"sv, "application/gzip"sv},
    std::pair{"bz2"sv, "application/x-bzip2"sv},
    std::pair{"xz"sv, "application/x-xz"sv},
    std::pair{"parquet"sv, "application/vnd.apache.parquet"sv},
    std::pair{"xlsx"sv, "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"sv},
    std::pair{"xls"sv, "application/vnd.ms-excel"sv},
    std::pair{"docx"sv,
              "application/vnd.openxmlformats-officedocument.wordprocessingml.document"sv},
    std::pair{"pptx"sv,
              "application/vnd.openxmlformats-officedocument.presentationml.presentation"sv},
    std::pair{"npy"sv, "application/x-npy"sv},
    std::pair{"npz"sv, "application/zip"sv},
    std::pair{"h5"sv, "application/x-hdf5"sv},
    std::pair{"hdf5"sv, "application/x-hdf5"sv},
    std::pair{"wav"sv, "audio/wav"sv},
    std::pair{"mp3"sv, "audio/mpeg"sv},
    std::pair{"ogg"sv, "audio/ogg"sv},
    std::pair{"flac"sv, "audio/flac"sv},
    std::pair{"mp4"sv, "video/mp4"sv},
    std::pair{"webm"sv, "video/webm"sv},
    std::pair{"mov"sv, "video/quicktime"sv},
};

}  // namespace

std::string media_type_for(std::string_view file_name) {
    const std::size_t slash = file_name.find_last_of('/');
    const std::string_view base =
        slash == std::string_view::npos ? file_name : file_name.substr(slash + 1);
    const std::size_t dot = base.find_last_of('.');
    constexpr std::size_t max_extension = 16;
    if (dot == std::string_view::npos || dot == 0 || base.size() - dot - 1 > max_extension) {
        return "application/octet-stream";
    }
    std::string extension(base.substr(dot + 1));
    for (char& c : extension) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    for (const auto& [known, type] : media_types) {
        if (known == extension) return std::string(type);
    }
    return "application/octet-stream";
}

}  // namespace moat
