// The CLI's subcommands. Each takes the arguments after its name and returns the process exit
// code.
#pragma once

namespace moat::cli {

int run_command(int argc, char** argv);

}  // namespace moat::cli
