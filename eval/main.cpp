// eval/main.cpp: k3eval_layer_diff (eval/layer_diff_command.cpp); exit codes 0 ok, 1 --check failed,
// 2 bad input.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <span>

#include "core/error.h"
#include "eval/layer_diff_command.h"

int main(int argc, char** argv) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // the launcher's environment (comm/nccl_comm.h)
  try {
    return k3::eval::layer_diff_command(std::span<char* const>(argv + 1, static_cast<size_t>(argc - 1)));
  } catch (const k3::core::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
