// eval/main.cpp: k3eval_layer_diff: `k3serve layer-diff` as a program of its own, for builds
// without src/cli (the GPU check). Same options, output and exit codes (2: bad input).
#include <exception>
#include <iostream>
#include <span>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  try {
    return k3::cli::layer_diff_command(std::span<char* const>(argv + 1, static_cast<size_t>(argc - 1)));
  } catch (const k3::core::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
