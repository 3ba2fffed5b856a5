// Whether this host can give a sandbox a template's layer (docs/architecture.md, "Layers and
// ownership"): an idmapped mount of a directory of the data directory's file system, tried for
// real with a throwaway user namespace. For `moat doctor`; a create needs no probe (it fails
// closed, naming the missing feature).
#pragma once

#include <moat/result.hpp>

#include <string>

namespace moat::templates {

// Clones `dir` as a detached mount and idmaps it onto a new user namespace. Needs root (as the
// helper does). The error's detail names the failing step and why.
result<void> probe_idmapped_mount(const std::string& dir);

}  // namespace moat::templates
