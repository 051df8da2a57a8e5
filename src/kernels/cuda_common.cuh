// kernels/cuda_common.cuh: what the CUDA ops share (included by kernels/*/cuda*.cu only):
// activation load/store with the rounding rules of kernels/common.h, warp/block reductions,
// weight formats (bf16 / f32 / MXFP4 decode), and the host-side checks behind supports().
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "core/tensor.h"
#include "kernels/common.h"
#include "kernels/op_table.h"

namespace k3::kernels::cuda_detail {

using bf16 = __nv_bfloat16;
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------- device: values and rounding

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
// The value x takes once stored as bf16 (round to nearest even; NaN stays NaN), = core::bf16_round.
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float round_if(float x, bool round) { return round ? round_bf16(x) : x; }
// Stores an activation: bf16 storage always rounds; f32 storage rounds when the precision is bf16
// (`round`), which is round_act() of the reference.
__device__ __forceinline__ void store_act(float* p, float v, bool round) { *p = round_if(v, round); }
__device__ __forceinline__ void store_act(bf16* p, float v, bool) { *p = __float2bfloat16_rn(v); }

// 1 / (1 + e^-x) with expf (accurate to 2 ulp on the device; libm on the CPU: tolerance).
__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// Reads element i of a bf16 or f32 weight vector (norm weights, biases).
__device__ __forceinline__ float load_vec(const void* p, bool is_bf16, int64_t i) {
  return is_bf16 ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// N consecutive activations at p as floats. N = 8 is the vector form (p 16-byte aligned: one uint4
// of bf16 or two float4 of f32); N = 1 the scalar form for odd widths and unaligned rows.
template <int N, class T>
__device__ __forceinline__ void load_act_n(const T* p, float (&v)[N]) {
  if constexpr (N == 8 && sizeof(T) == 2) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  } else if constexpr (N == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = to_f32(p[i]);
  }
}
template <int N, class T>
__device__ __forceinline__ void store_act_n(T* p, const float (&v)[N], bool round) {
  if constexpr (N == 8 && sizeof(T) == 2) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);  // .x = low half
      w[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if constexpr (N == 8) {
    float r[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = round_if(v[i], round);
    reinterpret_cast<float4*>(p)[0] = make_float4(r[0], r[1], r[2], r[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(r[4], r[5], r[6], r[7]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) store_act(p + i, v[i], round);
  }
}
// N consecutive entries of a bf16 or f32 weight vector from index i (16-byte aligned when N = 8).
template <int N>
__device__ __forceinline__ void load_vec_n(const void* p, bool is_bf16, int64_t i, float (&v)[N]) {
  if (is_bf16) load_act_n<N>(static_cast<const bf16*>(p) + i, v);
  else load_act_n<N>(static_cast<const float*>(p) + i, v);
}

// ---------------------------------------------------------------- device: reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the same total, summed
// warp by warp in a fixed order. `smem` holds 32 floats; the leading barrier makes back-to-back
// calls safe.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float t = lane < warps ? smem[lane] : 0.0f;
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float t = lane < warps ? smem[lane] : -INFINITY;
  return warp_max(t);
}

// ---------------------------------------------------------------- device: programmatic dependent launch
// Programmatic dependent launch (PDL, sm_90): a kernel started by launch_dependent() (host, below) may
// begin while the kernel before it on the stream still runs, so its launch, its CTAs' ramp-up and its
// first weight bytes overlap the predecessor's tail (at batch 1 a decode layer is 11-18 dependent kernels,
// each boundary a drain + launch + ramp, and every GEMV-like kernel starts streaming its weights only
// once it runs). The rules every converted kernel follows (read a converted kernel twice against them:
// a kernel launched with the attribute but missing its wait is a silent race):
//  1. pdl_wait() before the first read of anything a kernel of the step writes (activations, state,
//     caches, workspace, step tables, routes) and before the FIRST global write of any kind (the
//     predecessor may still read what would be overwritten). Before it a kernel reads only weights (norm
//     and conv vectors, parameters): prefetch_l2 of its first weight bytes, or loads of its first weights
//     into registers / shared memory.
//  2. Every thread of every CTA executes pdl_wait() on every path, also one that ends early (an unused
//     slot, an empty split): a grid then completes only after its wait returned, so a dependent's wait on
//     it covers every earlier kernel of the stream (the waits chain through the step).
//  3. pdl_launch_dependents() early (the top is fine): the hardware launches the dependent only once every
//     CTA of this grid has triggered or exited, so a multi-wave grid cannot deadlock (its later CTAs
//     trigger when they run) and the dependent's CTAs only take SM space this grid has left.
//  4. Every launch of a converted kernel uses launch_dependent(); a kernel with several launch sites
//     (template paths, strategies) converts all of them or none.
//  5. Kernels of the standard path are fine too: without the attribute pdl_wait() returns at once and
//     pdl_launch_dependents() does nothing; with it the results are the same bits, only earlier.
// Proof that the waits are there: kernels/testing/pdl_ops_test.cpp runs every converted op behind a slow
// producer kernel (it triggers, spins ~200 us, then writes the op's inputs) and compares bit for bit.
// Converted: multi_linear (mma, rowdot), attn_res_fused (bank, merge, merge cluster), kda_decode (head
// CTA, V-split cluster), mla_decode (q_absorb, both split_kv, combine_w_uv_gate), mla_w_uv (DCP), moe_tail
// (one launch, prologue, mma, rowdot), moe's expert GEMV (its down kernel a dependent of gate/up; it lets
// the next op start).
//
// Waits until every earlier kernel of the stream has completed with its writes visible (a no-op in a
// kernel launched without the attribute).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel of the stream (when launched by launch_dependent) start its pre-wait part now.
// Always safe to call early: the dependent still waits for this whole grid in its pdl_wait().
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Asks the memory system to bring [p, p + bytes) into L2 (TMA bulk prefetch; no registers, no completion
// to wait for). p 16-byte aligned, bytes a multiple of 16 and > 0.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}
// prefetch_l2 of the 16-byte aligned part inside [p, p + bytes) (any p, any bytes: the first and last
// partial 16 bytes are left out, so nothing outside the range is touched); nothing when that is empty.
__device__ __forceinline__ void prefetch_l2_within(const void* p, uint64_t bytes) {
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  const uint64_t first = (a + 15) & ~uint64_t{15}, last = (a + bytes) & ~uint64_t{15};
  if (last > first) prefetch_l2(reinterpret_cast<const void*>(first), static_cast<uint32_t>(last - first));
}

// ---------------------------------------------------------------- weights

// Storage of a linear weight W [rows, in]: dense f32 / bf16, or MXFP4 (spec §9: u8 codes [rows,
// in/2], even index in the low nibble, sign in bit 3; E8M0 scales [rows, in/32]).
enum class WFmt : uint8_t { f32, bf16, mxfp4 };

struct WeightRef {
  const void* data = nullptr;      // row r starts at data + r * ld (elements; bytes for MXFP4)
  const uint8_t* scale = nullptr;  // MXFP4 only: row r starts at scale + r * scale_ld
  int64_t ld = 0, scale_ld = 0;
};

// E2M1 code (4 bits) -> value: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, exact.
__device__ __forceinline__ float fp4_value(uint32_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const float mag = e == 0 ? 0.5f * static_cast<float>(m)
                           : __uint_as_float((126u + e) << 23) * (1.0f + 0.5f * static_cast<float>(m));
  return (code & 8u) ? -mag : mag;
}
// E8M0 -> 2^(e - 127); 0 is 2^-127 (a subnormal), 255 is NaN.
__device__ __forceinline__ float e8m0_value(uint8_t e) {
  if (e == 0) return __uint_as_float(0x00400000u);
  if (e == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(static_cast<uint32_t>(e) << 23);
}
// Element (r, i) of a weight, any format (the scalar path).
template <WFmt F>
__device__ __forceinline__ float weight_at(const WeightRef& w, int64_t r, int64_t i) {
  if constexpr (F == WFmt::f32) {
    return static_cast<const float*>(w.data)[r * w.ld + i];
  } else if constexpr (F == WFmt::bf16) {
    return __bfloat162float(static_cast<const bf16*>(w.data)[r * w.ld + i]);
  } else {
    const uint8_t byte = static_cast<const uint8_t*>(w.data)[r * w.ld + (i >> 1)];
    const uint32_t code = (i & 1) ? (byte >> 4) : (byte & 15u);
    return fp4_value(code) * e8m0_value(w.scale[r * w.scale_ld + (i >> 5)]);
  }
}

// ---------------------------------------------------------------- host: dispatch and checks

template <class T>
struct Tag {
  using type = T;
};
// Calls fn(Tag<float>) or fn(Tag<bf16>) for an activation dtype.
template <class Fn>
void with_act(core::DType dt, Fn&& fn) {
  if (dt == core::DType::bf16) fn(Tag<bf16>{});
  else fn(Tag<float>{});
}
template <class Fn>
void with_wfmt(WFmt f, Fn&& fn) {
  switch (f) {
    case WFmt::f32: fn(std::integral_constant<WFmt, WFmt::f32>{}); break;
    case WFmt::bf16: fn(std::integral_constant<WFmt, WFmt::bf16>{}); break;
    case WFmt::mxfp4: fn(std::integral_constant<WFmt, WFmt::mxfp4>{}); break;
  }
}

inline WFmt weight_format(const LinearWeight& w) {
  if (w.is_mxfp4()) return WFmt::mxfp4;
  return w.weight.dtype() == core::DType::bf16 ? WFmt::bf16 : WFmt::f32;
}
inline WeightRef weight_ref(const LinearWeight& w) {
  WeightRef r;
  r.data = w.weight.view().data;
  r.ld = w.weight.view().strides[0];
  if (w.is_mxfp4()) {
    r.scale = w.scale.data<const uint8_t>();
    r.scale_ld = w.scale.view().strides[0];
  }
  return r;
}

inline std::string describe(const core::TensorView& v) {
  return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str() + " on " +
         std::string(core::device_name(v.device));
}

using Named = std::pair<const char*, const core::TensorView*>;

// Every named view is a CUDA tensor (views with no elements pass).
inline core::Status on_cuda(std::initializer_list<Named> views) {
  for (const auto& [name, v] : views)
    if (v->numel() > 0 && v->device != core::Device::cuda)
      return core::Status::fail(std::string(name) + " must be a CUDA tensor, got " + describe(*v));
  return core::Status::ok();
}
inline core::Status weight_on_cuda(const LinearWeight& w, const char* name) {
  if (w.weight.view().device != core::Device::cuda || (w.is_mxfp4() && w.scale.view().device != core::Device::cuda))
    return core::Status::fail(std::string(name) + " must be uploaded to the CUDA device, got " +
                              describe(w.weight.view()));
  return core::Status::ok();
}

// Activations of one call share one dtype, bf16 or f32; bf16 storage only in Precision::bf16
// (Precision::fp32 promises no rounding anywhere, which bf16 storage cannot keep).
inline core::Status same_act(std::initializer_list<Named> views, Precision p) {
  const core::TensorView* first = views.begin()->second;
  for (const auto& [name, v] : views) {
    if (v->dtype != core::DType::bf16 && v->dtype != core::DType::f32)
      return core::Status::fail(std::string(name) + " must be a bf16 or f32 activation, got " + describe(*v));
    if (v->dtype != first->dtype)
      return core::Status::fail(std::string(name) + " is " + std::string(core::dtype_name(v->dtype)) + " but " +
                                views.begin()->first + " is " + std::string(core::dtype_name(first->dtype)) +
                                ": activations of one call share one dtype");
  }
  if (first->dtype == core::DType::bf16 && p != Precision::bf16)
    return core::Status::fail("bf16 activations need Precision::bf16 (Precision::fp32 runs on f32 activations)");
  return core::Status::ok();
}

// True when the memory spanned by two rank-2 row views overlaps (aliasing of in- and outputs).
inline bool overlaps(const core::TensorView& a, const core::TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto span = [](const core::TensorView& v) {
    const auto* p = static_cast<const char*>(v.data);
    const int64_t last = v.rank() == 2 ? (v.dim(0) - 1) * v.strides[0] + v.dim(1) : v.numel();
    return std::pair{p, p + last * static_cast<int64_t>(core::dtype_size(v.dtype))};
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

// Combines statuses: the first failure wins.
inline core::Status all_of(std::initializer_list<core::Status> ss) {
  for (const auto& s : ss)
    if (!s) return s;
  return core::Status::ok();
}

inline unsigned grid_for(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// Whether every row of a [T, D] view (and each extra vector) can be read 8 elements at a time.
inline bool rows_vec8(const core::TensorView& v) {
  const size_t row_bytes = static_cast<size_t>(v.rank() == 2 && v.dim(0) > 1 ? v.strides[0] : 0) *
                           core::dtype_size(v.dtype);
  return v.dim(v.rank() - 1) % 8 == 0 && aligned16(v.data) && row_bytes % 16 == 0;
}

// Raises a kernel's dynamic shared memory limit when a launch needs more than the default (the
// default 48 KiB bounds static + dynamic shared memory together, so a kernel with static arrays
// needs the raise below 48 KiB of dynamic bytes too). The context remembers the largest value set
// per kernel on its device, so the driver calls happen only when a launch needs more than any
// before it (backends/cuda/context.h).
template <class Kernel>
void allow_smem(const CudaOps& ops, Kernel kernel, size_t bytes) {
  ops.ctx->allow_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// Weight bytes per row that a grid of weight-streaming CTAs prefetches into L2 before its pdl_wait() (see
// the PDL rules above): the first bytes of each of its `rows` weight rows (the kernels walk k from 0, so
// those are the bytes they read first), the whole grid bounded to min(16 MiB, L2 / 3): on the H200 (50 MB
// L2) a third, so the predecessor's working set and the lines not yet consumed survive beside it; a 90 MB
// weight group gets its first ~18% in flight before the wait. A multiple of 16, at most row_bytes; 0 when
// a row gets less than 16 bytes (nothing worth a request).
inline uint32_t pdl_prefetch_row_bytes(int64_t rows, int64_t row_bytes, size_t l2_bytes) {
  if (rows <= 0 || row_bytes <= 0) return 0;
  const int64_t budget = std::min<int64_t>(int64_t{16} << 20, static_cast<int64_t>(l2_bytes / 3));
  const int64_t per_row = std::min(budget / rows, row_bytes) / 16 * 16;
  return static_cast<uint32_t>(std::max<int64_t>(per_row, 0));
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the stream's
// previous kernel (cudaLaunchAttributeProgrammaticStreamSerialization; kept as an edge by graph capture).
// Only for kernels that follow pdl_wait()'s rule above. cluster: a thread block cluster shape, or
// dim3(1, 1, 1) for none.
template <class... KernelArgs, class... Args>
void launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      dim3 cluster, Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[n++].val.programmaticStreamSerializationAllowed = 1;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {cluster.x, cluster.y, cluster.z};
  }
  cudaLaunchConfig_t cfg = {grid, block, smem, stream, attr, n};
  K3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// ---------------------------------------------------------------- tensor cores, weight streams

// c += A (16 x 16 bf16, row-major) * B (16 x 8 bf16, col-major), fp32 accumulate (PTX m16n8k16 .bf16
// fragments: a0 = (row g, k 2q..), a1 = (row g+8, k 2q..), a2 = (row g, k 2q+8..), a3 = (row g+8,
// k 2q+8..); b0 = (k 2q.., col g), b1 = (k 2q+8.., col g); c0,c1 = (row g, cols 2q, 2q+1), c2,c3 =
// (row g+8, same cols); g = lane / 4, q = lane % 4).
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes of weights, read once per call: bypass L1 (kept for the activation rows every warp re-reads).
__device__ __forceinline__ uint4 load_weight16(const bf16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

}  // namespace k3::kernels::cuda_detail
