// envd's file routes under `moat serve` (GET /files, POST /files, signed URLs), and what the
// file routes and the filesystem service share: the sandbox's home and user.
//
// GET /files streams a regular file out (404 JSON when missing, 400 for a directory or a path
// that is not a regular file); POST /files takes multipart/form-data (every part named "file";
// its filename is the destination when the query has no `path`) or application/octet-stream
// (`path` required), streams each file into the sandbox in bounded memory (one body piece and
// one backend chunk at a time), creates missing parent directories, and answers envd's
// [{"name","type":"file","path","metadata"?}]. The X-Metadata-<key> headers (key lowercased,
// the first value of each) become every uploaded file's metadata (files.hpp: user.e2b.<key>
// attributes, replacing what a replaced file had); a key or value that breaks the rules is 400
// before anything is written. A body with Content-Encoding: gzip is inflated as it is read (the
// caps count the inflated bytes). A file past serve_options::max_file_bytes is 413 and nothing
// of it is left. The whole body is capped too (max_file_bytes plus 1 MiB for multipart framing).
//
// Signed URLs: the routes accept a `signature` (and `signature_expiration`) query instead of the
// access token (envd_auth::token_or_signature). The verifier checks the signature against the
// named sandbox's token, or, for a request that names none (the SDK's URL for one shared envd
// address), against each live sandbox's token; an expired or wrong signature is 401.
#pragma once

#include "serve/envd_entry.hpp"
#include "serve/envd_service.hpp"

#include <optional>
#include <string>
#include <vector>

namespace moat::serve {

// The home directory envd paths resolve against (the sandbox layout's).
std::string sandbox_home(const registry_entry& sandbox);
// The user commands and files run as ("user" under moat serve).
std::string sandbox_user(const registry_entry& sandbox);

// The sandbox's root, the other user an envd call may name ("root"; Start, the file routes and
// the filesystem RPCs run as uid 0 inside for it), and its home.
inline constexpr std::string_view root_user = "root";
inline constexpr std::string_view root_home = "/root";
// The home paths resolve against for the sandbox's user, or for root.
std::string user_home(const registry_entry& sandbox, bool as_root);

// Fills each entry's metadata from the sandbox (entry_info::metadata), in batches of
// file_limits::max_files paths. Best effort per path, as envd's (an entry that vanished or
// cannot be read keeps none); fails only when the sandbox cannot be reached.
asio::awaitable<result<void>> async_fill_metadata(const registry_entry& sandbox,
                                                  std::vector<entry_info>& entries);

// What Stat answers for `path` (clean and absolute), as root or as the sandbox's user, or nothing
// when it does not exist or cannot be read (best effort: watch events' entries, envd_watch.cpp).
// envd_filesystem.cpp.
asio::awaitable<std::optional<entry_info>> async_stat_entry(serve_context& context,
                                                            const registry_entry& sandbox,
                                                            std::string path, bool as_root);

// An RPC's user (Authorization: Basic base64("<user>:")): nullopt when absent, the sandbox's user
// or root (`as_root` then true), else the one-line reason to refuse it (unauthenticated).
std::optional<std::string> check_rpc_user(const envd_call& call, bool& as_root);

}  // namespace moat::serve
