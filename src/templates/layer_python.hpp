// A layer's python3, found when a template is built and kept in its record
// (template_info::python): the interpreter of its sandboxes' Python environment
// (sandboxd/python_env.hpp). Nothing of the layer runs to find it.
#pragma once

#include <string>

namespace moat::templates {

// The real path, inside the tree at `root`, of the first python3 the default PATH finds there
// (/usr/local/bin, /usr/bin, /bin), its links resolved inside the tree (never outside it), when
// that is an executable regular file named python3.N; "" otherwise (no Python environment).
std::string find_python(const std::string& root);

}  // namespace moat::templates
