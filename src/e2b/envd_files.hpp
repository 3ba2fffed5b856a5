// Files over envd: GET /files (streamed out), POST /files (application/octet-stream, envd
// 0.5.7 or later, streamed in from a byte_source), and the filesystem service's Stat, ListDir,
// Move and Remove, with moat's contract (files.hpp) on top of envd's:
//
// - Paths must be absolute, without NUL, at most 4095 bytes (invalid_path); envd resolves them
//   inside the sandbox, so a planted symlink never reaches the host.
// - envd's upload creates parent directories and writes in place. moat writes to a temporary
//   name in the target's directory (".moat-upload-<hex>") and Moves it over the target once
//   every byte arrived; a failed or cancelled write removes it. Without create_parents (and
//   always for the batch write) the parent directory is checked with Stat first: missing is
//   file_not_found. A write to an existing directory is is_directory. Permission bits other than
//   envd's 0644 are set with chmod run in the sandbox before the Move.
// - A streamed read Stats the file first (regular files only; a final symlink is followed inside
//   the sandbox) and delivers exactly that many bytes in chunks of at most
//   file_stream_chunk_bytes. The GET is a second request: a body of another length (the file
//   grew, shrank or was replaced in between; its Content-Length, or the bytes a chunked body
//   brought) is backend_failure "file <path> changed while it was read (stat said N bytes, the
//   read returned M)", at the open when Content-Length tells, else at the pull that would have
//   completed the file: the last bytes are handed out only once the body has ended with them, so
//   a changed file is never returned whole at the Stat's size. A same-size replacement is not
//   seen.
// - Metadata (file_write_target::metadata) travels as X-Metadata-<key> headers of the upload
//   (envd 0.6.2 and later keep them as user.e2b.<key> attributes); the temporary file is Stat'ed
//   before the Move to check that envd kept them (not_supported if not: an older envd ignores the
//   headers). Reading metadata is one Stat per path (EntryInfo.metadata).
// - Each envd step is bounded by request_timeout; a streamed upload by request_timeout plus one
//   second per MiB of its cap.
#pragma once

#include "e2b/envd_calls.hpp"

#include <moat/files.hpp>
#include <moat/result.hpp>

#include <asio/awaitable.hpp>

#include <string>
#include <vector>

namespace moat::e2b {

asio::awaitable<result<std::vector<file_write_result>>> async_envd_write_files(
    state_ptr s, std::vector<file_write> files);
asio::awaitable<result<std::vector<file_read_result>>> async_envd_read_files(
    state_ptr s, std::vector<std::string> paths);
asio::awaitable<result<file_write_result>> async_envd_write_stream(state_ptr s,
                                                                   file_write_target target,
                                                                   byte_source source);
asio::awaitable<result<file_read_stream>> async_envd_read_stream(state_ptr s, std::string path);
asio::awaitable<result<std::vector<file_metadata_result>>> async_envd_read_metadata(
    state_ptr s, std::vector<std::string> paths);
asio::awaitable<result<file_stat>> async_envd_stat(state_ptr s, std::string path);
asio::awaitable<result<std::vector<dir_entry>>> async_envd_list_dir(state_ptr s, std::string path);

}  // namespace moat::e2b
