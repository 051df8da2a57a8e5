// cli/bench/commands.h: the load-test subcommands, built into their own program k3serve-bench so
// that the server's build (scripts/setup.sh) leaves out the load generator. `k3serve bench-serve`
// and `k3serve bench-compare` run it (cli/main.cpp); it also runs on its own. Each takes the
// arguments after its name and returns the exit code; bad input throws core::Error (exit 2).
#pragma once
#include <span>

namespace k3::cli {

int bench_serve_command(std::span<char* const> argv);
int bench_compare_command(std::span<char* const> argv);

}  // namespace k3::cli
