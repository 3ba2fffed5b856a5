#include "serve/sandbox_templates.hpp"

#include <moat/templates.hpp>

#include <string_view>

namespace moat::serve {
namespace {

bool is_e2b_default_template(std::string_view name) {
    return name == "code-interpreter-v1" || name == "code-interpreter" ||
           name == "code-interpreter-beta";
}

}  // namespace

std::optional<std::string> template_for(const serve_context& context, const std::string& id) {
    if (id == "base") return std::string();
    if (!context.options.data_dir.empty() && template_store(context.options.data_dir).find(id))
        return id;
    if (is_e2b_default_template(id)) return std::string();
    return std::nullopt;
}

}  // namespace moat::serve
