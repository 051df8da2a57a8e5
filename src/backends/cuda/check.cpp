// backends/cuda/check.cpp: the error path of the CUDA check macros.
#include "backends/cuda/check.h"

#include <string>

namespace k3::backends::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw core::Error("CUDA error at " + std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                    cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace k3::backends::cuda
