// kernels/moe/cuda_router_select.cuh: ONE BLOCK OF 8 WARPS picks one token's top-k routes (spec §7), the
// selection of router_topk (router.h) as a device function: the router kernel (cuda_router.cu) runs a
// block per token, and multi_linear's packed MoE front runs it in the epilogue of its last router CTA.
//
//   s = sigmoid(logit) fp32, b = s + bias; the k best b (higher wins, the lower id on exact ties, as
//   router_topk_reference) in descending order; weights use s only:
//   renormalize: w_j = s_j / (sum_{selected, in written order} s + 1e-20) * scaling; else s_j * scaling.
//   A NaN b cannot throw from the device: the token gets ids -1 and NaN weights (the expert op turns
//   them into a NaN output row, never an out-of-range read).
//
// How (E <= 1024 experts, k <= 32; b becomes an order-preserving 32-bit key, (key, id) pairs are ranked
// by the reference's order: the higher key first, the lower id on equal keys):
//   1. thread i computes the pairs of experts i, i + 256, i + 512, i + 768 (all loads in flight at once);
//   2. each warp finds the k best of its 128 pairs (warp_top_k): m = the k-th largest of its 32 lanes'
//      maxima bounds them from below (at least k pairs are >= m), only the pairs >= m (~k + 10 for
//      real router scores) are compacted, and each one's place among them is counted directly;
//   3. warp 0 finds the k best of the 8 warps' 8k candidates the same way: the k picks, in place order.
// Everything is registers, shuffles and a few shared words: two block barriers in all. Many exact ties
// (more than kTopkSurvivors pairs >= m) fall back to counting every pair's place over the warp's pairs.
// Measured before (H200, ncu, one token, E = 896, k = 16; cycles: docs/perf/fastpath.md, b569b2e): the
// radix select this replaced (four 8-bit passes over a shared histogram, ~20 barriers, atomics piled on
// the few bins router scores share) and a one-warp version of the scheme above (one long chain of
// dependent instructions in one warp) took about as long as each other: the work has to be spread over
// the warps.
#pragma once
#include <cstdint>

#include "kernels/cuda_common.cuh"

namespace k3::kernels::cuda_detail {

inline constexpr int kTopkThreads = 256;  // 8 warps per token
inline constexpr int kTopkWarps = kTopkThreads / 32;
inline constexpr int kTopkPairsPerThread = 4;
inline constexpr int kTopkMaxExperts = kTopkThreads * kTopkPairsPerThread;  // 1024
inline constexpr int kTopkMaxK = 32;
inline constexpr int kTopkSurvivors = 64;  // per warp: two per lane

// Whether block_router_topk takes top-k of E experts.
inline constexpr bool block_router_topk_fits(int64_t E, int64_t k) { return E <= kTopkMaxExperts && k <= kTopkMaxK; }

// The shared memory of one selection (10.4 KB).
struct RouterTopkSmem {
  float score[kTopkMaxExperts];                   // s of expert e
  uint32_t surv_key[kTopkWarps][kTopkSurvivors];  // each warp's survivors
  int surv_id[kTopkWarps][kTopkSurvivors];
  uint32_t cand_key[kTopkWarps][kTopkMaxK];  // each warp's k best, in place order
  int cand_id[kTopkWarps][kTopkMaxK];
  uint32_t pick_key[kTopkMaxK];  // the k picks, in place order
  int pick_id[kTopkMaxK];
};
static_assert(sizeof(RouterTopkSmem) <= 12 * 1024, "the selection's shared memory stays small");

// Orders like the float (after -0 -> +0, which the reference's != treats as equal to +0). Every real
// key is >= 0x007FFFFF (-inf), so 0 marks "no expert" and always ranks after the real ones.
__device__ __forceinline__ uint32_t router_order_key(float b) {
  const uint32_t u = __float_as_uint(b + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (key, id) order of the reference: the higher key first, the lower id on equal keys.
__device__ __forceinline__ bool router_better(uint32_t ka, int ia, uint32_t kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// The k-th largest of the 32 lanes' v (1 <= k <= 32): a bitonic sort over the lanes, descending.
__device__ __forceinline__ uint32_t warp_kth_largest(uint32_t v, int k) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const uint32_t other = __shfl_xor_sync(kFullMask, v, stride);
      const bool descending = (lane & size) == 0, lower = (lane & stride) == 0;
      v = lower == descending ? max(v, other) : min(v, other);
    }
  return __shfl_sync(kFullMask, v, k - 1);
}

// The k best of the warp's pairs (R per lane, distinct ids; at least k of them, padding with key 0
// allowed) into out_key / out_id [k] in place order. surv_key / surv_id: kTopkSurvivors shared words
// each, this warp's. Called by all 32 lanes.
template <int R>
__device__ void warp_top_k(const uint32_t (&key)[R], const int (&id)[R], int k, uint32_t* surv_key, int* surv_id,
                           uint32_t* out_key, int* out_id) {
  const int lane = threadIdx.x & 31;
  uint32_t lane_max = 0u;
#pragma unroll
  for (int r = 0; r < R; ++r) lane_max = max(lane_max, key[r]);
  const uint32_t m = warp_kth_largest(lane_max, k);  // at least k pairs are >= m

  const unsigned lanes_below = (1u << lane) - 1u;
  int n = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const bool s = key[r] >= m;
    const unsigned bal = __ballot_sync(kFullMask, s);
    const int p = n + __popc(bal & lanes_below);
    if (s && p < kTopkSurvivors) surv_key[p] = key[r], surv_id[p] = id[r];
    n += __popc(bal);
  }
  __syncwarp();
  if (n <= kTopkSurvivors) {  // each survivor's place among the survivors
    for (int c = lane; c < n; c += 32) {
      const uint32_t kc = surv_key[c];
      const int ic = surv_id[c];
      int place = 0;
#pragma unroll 8
      for (int i = 0; i < n; ++i) place += router_better(surv_key[i], surv_id[i], kc, ic) ? 1 : 0;
      if (place < k) out_key[place] = kc, out_id[place] = ic;
    }
  } else {  // many ties: each pair's place among all the warp's pairs
    int place[R];
#pragma unroll
    for (int r = 0; r < R; ++r) place[r] = 0;
    for (int src = 0; src < 32; ++src)
#pragma unroll
      for (int q = 0; q < R; ++q) {
        const uint32_t kq = __shfl_sync(kFullMask, key[q], src);
        const int iq = __shfl_sync(kFullMask, id[q], src);
#pragma unroll
        for (int r = 0; r < R; ++r) place[r] += router_better(kq, iq, key[r], id[r]) ? 1 : 0;
      }
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (place[r] < k) out_key[place[r]] = key[r], out_id[place[r]] = id[r];
  }
  __syncwarp();
}

// The routes of one token by the whole block (kTopkThreads threads, all of them; block-uniform call):
// logits [E] are read through L2 (ld.global.cg), so a kernel may select over logits its other CTAs wrote
// before a fence. ids [k], weights [k] out. Requires 1 <= k <= min(E, kTopkMaxK), E <= kTopkMaxExperts.
// Leaves with a barrier: `sm` may be reused right after.
template <class BiasT>
__device__ void block_router_topk_t(const float* logits, const BiasT* bias, int E, int k, bool renormalize,
                                    float scaling, int32_t* ids, float* weights, RouterTopkSmem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t key[kTopkPairsPerThread];
  int id[kTopkPairsPerThread];
  float lg[kTopkPairsPerThread], bs[kTopkPairsPerThread];
#pragma unroll
  for (int r = 0; r < kTopkPairsPerThread; ++r) {  // branch-free: clamped indices, masked below
    const int e = min(tid + kTopkThreads * r, E - 1);
    lg[r] = __ldcg(logits + e);
    bs[r] = static_cast<float>(bias[e]);
  }
  bool nan_seen = false;
#pragma unroll
  for (int r = 0; r < kTopkPairsPerThread; ++r) {
    const int e = tid + kTopkThreads * r;
    const float s = sigmoid_f32(lg[r]), b = s + bs[r];
    const bool real = e < E;
    nan_seen = nan_seen || (real && isnan(b));
    key[r] = real ? router_order_key(b) : 0u;
    id[r] = e;  // >= E for padding: distinct, and after every real id
    if (real) sm.score[e] = s;
  }
  if (__syncthreads_or(nan_seen)) {
    for (int j = tid; j < k; j += kTopkThreads) ids[j] = -1, weights[j] = NAN;
    __syncthreads();
    return;
  }
  warp_top_k(key, id, k, sm.surv_key[warp], sm.surv_id[warp], sm.cand_key[warp], sm.cand_id[warp]);
  __syncthreads();
  if (warp == 0) {  // the 8 warps' k best: candidate c = lane + 32 r (8k <= 256 of them)
    constexpr int R = kTopkWarps * kTopkMaxK / 32;
    uint32_t ck[R];
    int ci[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int c = lane + 32 * r, w = c / k, j = c % k;
      const bool real = c < kTopkWarps * k;
      ck[r] = real ? sm.cand_key[w][j] : 0u;
      ci[r] = real ? sm.cand_id[w][j] : kTopkMaxExperts + c;  // padding: distinct, after every real id
    }
    warp_top_k(ck, ci, k, sm.surv_key[0], sm.surv_id[0], sm.pick_key, sm.pick_id);
    const int pid = lane < k ? sm.pick_id[lane] : 0;
    const float s = lane < k ? sm.score[pid] : 0.0f;
    float sum = 0.0f;  // in place order, sequential (the reference's order); the same on every lane
    for (int j = 0; j < k; ++j) sum += __shfl_sync(kFullMask, s, j);
    const float denom = sum + 1e-20f;
    if (lane < k) {
      ids[lane] = pid;
      weights[lane] = renormalize ? s / denom * scaling : s * scaling;
    }
  }
  __syncthreads();
}

// block_router_topk_t for a bias stored as f32 or bf16.
__device__ inline void block_router_topk(const float* logits, const void* bias, bool bias_bf16, int E, int k,
                                         bool renormalize, float scaling, int32_t* ids, float* weights,
                                         RouterTopkSmem& sm) {
  if (bias_bf16)
    block_router_topk_t(logits, static_cast<const bf16*>(bias), E, k, renormalize, scaling, ids, weights, sm);
  else block_router_topk_t(logits, static_cast<const float*>(bias), E, k, renormalize, scaling, ids, weights, sm);
}

}  // namespace k3::kernels::cuda_detail
