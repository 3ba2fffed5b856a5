// The CLI's subcommands. Each takes the arguments after its name and returns the process exit
// code (see arguments.hpp for the CLI's own codes).
#pragma once

#include <asio/any_io_executor.hpp>

#include <memory>
#include <string>

namespace moat {
class session_store;
}

namespace moat::cli {

int run_command(int argc, char** argv);        // moat run: one command in a fresh sandbox
int create_command(int argc, char** argv);     // moat create: a sandbox that outlives the CLI
int exec_command(int argc, char** argv);       // moat exec: a command in an existing sandbox
int session_command(int argc, char** argv);    // moat session exec|end|ls: shared sessions
int cp_command(int argc, char** argv);         // moat cp: files in and out
int network_command(int argc, char** argv);    // moat network: a running sandbox's egress rules
int destroy_command(int argc, char** argv);    // moat destroy: end sandboxes, confirmed
int ls_command(int argc, char** argv);         // moat ls: every sandbox on this host
int pause_command(int argc, char** argv);      // moat pause: freeze sandboxes in place
int resume_command(int argc, char** argv);     // moat resume: thaw them
int doctor_command(int argc, char** argv);     // moat doctor: what this host can enforce
int inventory_command(int argc, char** argv);  // moat inventory: every sandbox and its usage
int janitor_command(int argc, char** argv);    // moat janitor: clean up after crashes
int smoke_command(int argc, char** argv);      // moat smoke: a deployment check
int bench_command(int argc, char** argv);      // moat bench create|advise: latency, pooling
int mcp_command(int argc, char** argv);        // moat mcp: an MCP tool server on stdio
int demo_command(int argc, char** argv);       // moat demo: a scripted model conversation
int serve_command(int argc, char** argv);      // moat serve: an E2B-compatible sandbox host
int template_command(int argc, char** argv);   // moat template: the local backend's templates

// moat port-forward: local ports relayed to ports inside an existing sandbox.
int port_forward_command(int argc, char** argv);

// The shared session store `url` names (--store, MOAT_STORE) for moat session and moat mcp
// --session: "" or "host" (the host-local store in its default directory) or "host:DIR". Throws
// usage_error (never echoing the URL, which may carry a password) for anything else.
std::shared_ptr<session_store> open_session_store(const std::string& url,
                                                  asio::any_io_executor executor);
// The same check alone, for parsing (before any coroutine runs).
void check_session_store_url(const std::string& url);

}  // namespace moat::cli
