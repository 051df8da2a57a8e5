// comm/rank_sum.cu: the rank-order sum kernel (see rank_sum.h). Memory-bound and tiny next to the
// NCCL transfers around it; a grid-stride loop over elements, the rank loop innermost so each
// element's adds happen in rank order in one thread.
#include "comm/rank_sum.h"

#include <string>

#include "backends/cuda/check.h"

namespace k3::comm {
namespace {

__device__ __forceinline__ float bf16_to_f32(uint16_t b) { return __uint_as_float(uint32_t{b} << 16); }

// Same rounding as core::f32_to_bf16_bits (RNE, NaN kept quiet NaN), so CPU and GPU agree bitwise.
__device__ __forceinline__ uint16_t f32_to_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__global__ void rank_sum_f32(const float* __restrict__ chunks, int64_t stride, int n, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    float acc = chunks[i];
    for (int q = 1; q < n; ++q) acc = __fadd_rn(acc, chunks[q * stride + i]);  // never fused
    out[i] = acc;
  }
}

__global__ void rank_sum_bf16(const uint16_t* __restrict__ chunks, int64_t stride, int n, int64_t count,
                              uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    float acc = bf16_to_f32(chunks[i]);
    for (int q = 1; q < n; ++q) acc = __fadd_rn(acc, bf16_to_f32(chunks[q * stride + i]));
    out[i] = f32_to_bf16(acc);
  }
}

}  // namespace

void rank_sum(const void* chunks, int64_t chunk_stride, int n, int64_t count, core::DType dtype, void* out,
              cudaStream_t stream) {
  K3_CHECK(n >= 1, "comm::rank_sum: rank count must be >= 1, got " + std::to_string(n));
  K3_CHECK(dtype == core::DType::f32 || dtype == core::DType::bf16,
           "comm::rank_sum: dtype must be F32 or BF16, got " + std::string(core::dtype_name(dtype)));
  if (count == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks_needed = (count + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks_needed < 1024 ? blocks_needed : 1024);
  if (dtype == core::DType::f32) {
    rank_sum_f32<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(chunks), chunk_stride, n, count,
                                                  static_cast<float*>(out));
    K3_CUDA_CHECK_LAUNCH("rank_sum_f32");
  } else {
    rank_sum_bf16<<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(chunks), chunk_stride, n, count,
                                                   static_cast<uint16_t*>(out));
    K3_CUDA_CHECK_LAUNCH("rank_sum_bf16");
  }
}

}  // namespace k3::comm
