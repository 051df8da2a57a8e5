// kernels/moe/cuda_router.cu: CUDA sigmoid router with biased top-k (spec §7), one warp per token:
// s = sigmoid(logits) fp32; k rounds of a warp-wide argmax over s + bias (higher wins, the lower
// id on exact ties, as the reference); weights use s only:
//   renormalize: w_j = s_j / (sum_{selected, in written order} s + 1e-20) * scaling; else s_j * scaling.
// A NaN biased score cannot throw from the device: that token gets ids -1 and NaN weights, which the
// expert op turns into a NaN output row (never an out-of-range read).
#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/moe/router.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;      // the scores: all threads; the k rounds: warp 0 alone
constexpr int kMaxExperts = 8192;  // shared memory: score + biased + taken flag per expert

// (value, id) ordering of the reference: higher value first, lower id on ties.
__device__ __forceinline__ bool better(float v, int id, float bv, int bid) {
  return v > bv || (v == bv && id < bid);
}

// In the k rounds (warp 0), lane l owns experts e = l, l + 32, ...: it alone reads and writes their
// `taken` flags and keeps the best untaken one in registers, so a round is one warp argmax plus one
// lane's rescan, with no block barrier.
__device__ __forceinline__ void lane_best(const float* biased, const unsigned char* taken, int E, int lane,
                                          float& bv, int& bid) {
  bv = -INFINITY, bid = 0x7fffffff;
  for (int e = lane; e < E; e += 32)
    if (!taken[e] && better(biased[e], e, bv, bid)) bv = biased[e], bid = e;
}

__global__ void __launch_bounds__(kThreads) router_kernel(const float* logits, int64_t logits_ld, const void* bias,
                                                          bool bias_bf16, int E, int k, int32_t* ids,
                                                          int64_t ids_ld, float* weights, int64_t weights_ld,
                                                          bool renormalize, float scaling) {
  extern __shared__ float smem[];
  float* score = smem;                                                    // [E]
  float* biased = smem + E;                                               // [E]
  unsigned char* taken = reinterpret_cast<unsigned char*>(smem + 2 * E);  // [E]
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  bool nan_seen = false;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {  // many loads in flight
    const float s = 1.0f / (1.0f + expf(-logits[t * logits_ld + e]));
    score[e] = s;
    biased[e] = s + load_vec(bias, bias_bf16, e);
    taken[e] = 0;
    nan_seen = nan_seen || isnan(biased[e]);
  }
  int32_t* ids_t = ids + t * ids_ld;
  float* w_t = weights + t * weights_ld;
  if (__syncthreads_or(nan_seen)) {  // also publishes the scores to warp 0
    for (int j = threadIdx.x; j < k; j += blockDim.x) ids_t[j] = -1, w_t[j] = NAN;
    return;
  }
  if (threadIdx.x >= 32) return;
  float bv;
  int bid;
  lane_best(biased, taken, E, lane, bv, bid);
  float sum = 0.0f;  // lane 0: selected scores in written order
  for (int j = 0; j < k; ++j) {
    float v = bv;
    int id = bid;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, v, o);
      const int oid = __shfl_xor_sync(kFullMask, id, o);
      if (better(ov, oid, v, id)) v = ov, id = oid;
    }
    // -inf biased scores still rank (lowest id first), as the reference's sort.
    if (lane == 0) {
      ids_t[j] = id;
      sum += score[id];
    }
    if (lane == (id & 31)) {
      taken[id] = 1;
      lane_best(biased, taken, E, lane, bv, bid);
    }
  }
  if (lane == 0) {
    const float denom = sum + 1e-20f;
    for (int j = 0; j < k; ++j) {
      const float s = score[ids_t[j]];
      w_t[j] = renormalize ? s / denom * scaling : s * scaling;
    }
  }
}

}  // namespace

void register_router_cuda(Registry& r, const CudaOps& ops) {
  r.router_topk.add(
      {"cuda_block_topk", core::Device::cuda, 10,
       [ops](const RouterTopkArgs& a) {
         if (auto s = ops.usable(); !s) return s;
         if (a.logits.dim(1) > kMaxExperts)
           return core::Status::fail("at most " + std::to_string(kMaxExperts) + " experts, got " +
                                     std::to_string(a.logits.dim(1)));
         return on_cuda({{"logits", &a.logits}, {"bias", &a.bias}, {"ids", &a.ids}, {"weights", &a.weights}});
       },
       [ops](const RouterTopkArgs& a) {
         const int64_t T = a.logits.dim(0);
         const int E = static_cast<int>(a.logits.dim(1)), k = static_cast<int>(a.ids.dim(1));
         if (T == 0) return;
         const size_t smem = static_cast<size_t>(E) * (2 * sizeof(float) + 1);
         allow_smem(router_kernel, smem);
         router_kernel<<<static_cast<unsigned>(T), kThreads, smem, ops.ctx->stream()>>>(
             a.logits.as<const float>(), a.logits.strides[0], a.bias.data, a.bias.dtype == core::DType::bf16, E, k,
             a.ids.as<int32_t>(), a.ids.strides[0], a.weights.as<float>(), a.weights.strides[0], a.renormalize,
             a.scaling);
         K3_CUDA_CHECK_LAUNCH("router_kernel");
       }});
}

}  // namespace k3::kernels
