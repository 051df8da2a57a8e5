// eval/layer_diff_command.h: the k3eval_layer_diff program (eval/main.cpp) as a function the tests
// drive in process: the arguments after the program name; returns the exit code (0 ok, 1 --check
// failed); bad input throws core::Error (main prints it, exit 2).
#pragma once
#include <span>

namespace k3::eval {

int layer_diff_command(std::span<char* const> argv);

}  // namespace k3::eval
