// backends/cuda/check.h: every CUDA runtime call and kernel launch goes through these macros; a
// failure becomes a core::Error naming file:line, the failing expression and CUDA's error string.
#pragma once
#include <cuda_runtime.h>

#include "core/error.h"

namespace k3::backends::cuda {

// Throws core::Error("CUDA error at FILE:LINE: EXPR: cudaErrorName (description)").
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace k3::backends::cuda

#define K3_CUDA_CHECK(expr)                                                                                           \
  do {                                                                                                                \
    const cudaError_t k3_cuda_err_ = (expr);                                                                          \
    if (k3_cuda_err_ != cudaSuccess) ::k3::backends::cuda::throw_cuda_error(k3_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel<<<...>>> launch: reports a bad launch configuration (and any earlier
// asynchronous fault that is still pending), naming the kernel.
#define K3_CUDA_CHECK_LAUNCH(kernel_name)                                                                 \
  do {                                                                                                    \
    const cudaError_t k3_cuda_err_ = cudaGetLastError();                                                  \
    if (k3_cuda_err_ != cudaSuccess)                                                                      \
      ::k3::backends::cuda::throw_cuda_error(k3_cuda_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)
