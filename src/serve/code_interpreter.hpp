// `moat serve`'s E2B Code Interpreter: what `@e2b/code-interpreter` reaches on port 49999 of a
// sandbox (`49999-<id>.<domain>`, or E2b-Sandbox-Port: 49999 on envd's listener), answered by
// serve itself over the sandbox's resident interpreter (tools/python_kernel.hpp), never by a
// server in the sandbox. The wire is e2b_protocol/code_interpreter_messages.hpp.
//
//   GET  /health                     200 "OK"
//   POST /execute                    200, NDJSON: stdout/stderr as they arrive, each display
//                                    result (images base64), the error, the execution count,
//                                    end_of_execution; a keepalive line after 5 s of quiet
//   GET  /contexts                   the sandbox's contexts: its default python one ("default"),
//                                    a default javascript one (made on first need), those created
//   POST /contexts                   {language?, cwd?} -> {id, language, cwd}
//   DELETE /contexts/{id}            204
//   POST /contexts/{id}/restart      204
//
// Access: what the port proxy checks first (the sandbox is a live one of this server, its traffic
// token where its ports are private), and on /execute the sandbox's X-Access-Token as well, as
// the SDK sends it there only. Answers: 422 for a body that does not validate, 400 for a context
// and a language together, 404 for an unknown context, 401 without the access token on
// /execute, 404 for another path.
//
// A cell runs at most serve_options::code_cell_limit; past it the interpreter interrupts it
// (KeyboardInterrupt, the context kept) and, 2 s later, kills and restarts it, which the
// execution's error line says. A client that goes away mid-cell (the SDK's timeoutMs) stops the
// cell: its interpreter is killed and the context's next cell starts a new one.
#pragma once

#include "http/server.hpp"
#include "serve/sandbox_registry.hpp"
#include "serve/serve_context.hpp"

#include <asio/awaitable.hpp>

#include <memory>

namespace moat::serve {

class code_interpreter {
  public:
    explicit code_interpreter(serve_context& context);
    ~code_interpreter();
    code_interpreter(const code_interpreter&) = delete;
    code_interpreter& operator=(const code_interpreter&) = delete;

    // Answers one request for `sandbox`'s port 49999 (after the port proxy's checks).
    asio::awaitable<void> async_serve(std::shared_ptr<registry_entry> sandbox,
                                      http::server_request& request,
                                      http::server_response& response);

    struct state;

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat::serve
