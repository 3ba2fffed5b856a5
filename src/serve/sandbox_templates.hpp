// What a create's templateID names under `moat serve`: "base" (the default root), a template of
// the backend's data directory (templates.hpp; serve_options::data_dir), or one of the names
// E2B's Code Interpreter SDKs create with by default, which are the default root until a
// template of that name exists (its Python packages are the host's: scripts/install-deps
// installs IPython, matplotlib, pandas, numpy).
#pragma once

#include "serve/serve_context.hpp"

#include <optional>
#include <string>

namespace moat::serve {

// The sandbox_spec::template_name to create with ("" for the default root); nullopt when no
// template has that name.
std::optional<std::string> template_for(const serve_context& context, const std::string& id);

}  // namespace moat::serve
