// kernels/mla/cuda_naive_flash.cuh: internal to kernels/mla: registration of the tensor-core MLA prefill
// strategy "cuda_expand_gemm_flash" of mla_naive (cuda_naive_flash.cu), called by register_mla_naive_cuda.
#pragma once
#include "kernels/mla/ops.h"
#include "kernels/registry.h"

namespace k3::kernels {

// Adds "cuda_expand_gemm_flash" to r.mla_naive: bf16 mode over bf16 / fp8 caches.
void register_mla_naive_flash_cuda(MlaOps& r, const CudaOps& ops);

}  // namespace k3::kernels
