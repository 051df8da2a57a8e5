// cli/bench/main.cpp: the k3serve-bench program: bench-serve and bench-compare. `k3serve
// bench-serve ...` executes it with the same arguments (cli/main.cpp), so the recorded commands
// of every bundle keep working.
#include <cstring>
#include <exception>
#include <iostream>
#include <span>
#include <string>

#include "cli/bench/commands.h"
#include "core/error.h"

namespace {

constexpr const char* kUsage =
    "usage: k3serve bench-serve|bench-compare [options]   (k3serve <command> --help for its options)\n"
    "commands:\n"
    "  bench-serve      load-test a running server (random, shared-prefix, agentic, trace) -> bundle\n"
    "  bench-compare    compare bench-serve bundles: ratios, bootstrap CIs, regressions, SVG plots\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::span<char* const> rest(argv + 2, static_cast<size_t>(argc - 2));
  try {
    if (command == "bench-serve") return k3::cli::bench_serve_command(rest);
    if (command == "bench-compare") return k3::cli::bench_compare_command(rest);
    std::cerr << "error: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const k3::core::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
