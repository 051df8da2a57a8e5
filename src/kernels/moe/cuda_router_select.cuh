// kernels/moe/cuda_router_select.cuh: ONE WARP picks one token's top-k routes (spec §7), the selection
// of router_topk (router.h) as a device function: the router kernel (cuda_router.cu) runs a warp per
// token, and multi_linear's packed MoE front runs it in the epilogue of its last router CTA.
//
//   s = sigmoid(logit) fp32, b = s + bias; the k best b (higher wins, the lower id on exact ties, as
//   router_topk_reference) in descending order; weights use s only:
//   renormalize: w_j = s_j / (sum_{selected, in written order} s + 1e-20) * scaling; else s_j * scaling.
//   A NaN b cannot throw from the device: the token gets ids -1 and NaN weights (the expert op turns
//   them into a NaN output row, never an out-of-range read).
//
// How, without barriers or atomics (one token = E keys, E <= 1024):
//   1. lane l computes the order-preserving 32-bit keys of experts l, l + 32, ... (16 loads in flight),
//      writes them to the warp's shared scratch and keeps its own largest;
//   2. m = the k-th largest of the 32 lane maxima (a bitonic sort over the lanes): at least k keys are
//      >= m, so every pick is among the keys >= m (for real router scores ~k + 10 of the 896);
//   3. those survivors are compacted in id order (at most kWarpTopkSurvivors), and each survivor's
//      place is the number of survivors better than it: the k best are the picks, in order.
//   With more survivors (many exact ties) a bisection over the key bits (one warp reduction per bit)
//   finds the k-th largest key over all keys instead, and the picks are placed the same way.
// The radix select this replaced (four 8-bit passes over a shared histogram) spent ~18.7K cycles
// per token on ~20 barriers and atomics piled on the few bins that router scores share; a first
// version of this one (bisection over all keys, loads one at a time) measured 26.6 us per token.
#pragma once
#include <cstdint>

#include "kernels/cuda_common.cuh"

namespace k3::kernels::cuda_detail {

inline constexpr int kWarpTopkMaxExperts = 1024;  // 32 keys per lane
inline constexpr int kWarpTopkMaxK = 32;          // one pick per lane when placing them
inline constexpr int kWarpTopkSurvivors = 64;     // two per lane
// Shared-memory words one warp's selection needs: every expert's key, the survivors' keys and ids,
// then the scores of up to kWarpTopkMaxK picks in place order (4.6 KB).
inline constexpr int kWarpTopkScratchWords = kWarpTopkMaxExperts + 2 * kWarpTopkSurvivors + kWarpTopkMaxK;

// Orders like the float (after -0 -> +0, which the reference's != treats as equal to +0). Every real
// key is >= 0x007FFFFF (-inf), so 0 marks "no expert" and is never picked.
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

// The picks when the survivors did not fit: bisection over all M keys per lane for the k-th largest
// key t, then the keys above t and the lowest ids equal to it, compacted in id order into
// pick_key / pick_id [k] (not yet in place order).
__device__ inline void warp_picks_by_bisection(const uint32_t* key, int M, int k, uint32_t* pick_key, int* pick_id) {
  const int lane = threadIdx.x & 31;
  uint32_t t = 0u;  // invariant: at least k keys are >= t; `exact`: exactly k are
  bool exact = false;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = t | (1u << bit);
    unsigned n = 0;
    for (int j = 0; j < M; ++j) n += key[lane + 32 * j] >= cand ? 1u : 0u;
    n = __reduce_add_sync(kFullMask, n);
    if (n >= static_cast<unsigned>(k)) {
      t = cand;
      if (n == static_cast<unsigned>(k)) {
        exact = true;
        break;
      }
    }
  }
  int ties = 0;  // without `exact`, t is the k-th largest key: the keys above it and `ties` equal ones
  if (!exact) {
    unsigned above = 0;
    for (int j = 0; j < M; ++j) above += key[lane + 32 * j] > t ? 1u : 0u;
    ties = k - static_cast<int>(__reduce_add_sync(kFullMask, above));
  }
  const unsigned lanes_below = (1u << lane) - 1u;
  int n_picked = 0;
  for (int j = 0; j < M; ++j) {  // id order: expert lane + 32 j, j major
    const uint32_t kj = key[lane + 32 * j];
    bool take = exact ? kj >= t : kj > t;
    if (!exact) {
      const bool equal = kj == t;
      const unsigned eq = __ballot_sync(kFullMask, equal);
      take = take || (equal && __popc(eq & lanes_below) < ties);
      ties -= __popc(eq);  // the equal keys of later j rank after these (ties <= 0 takes none)
    }
    const unsigned taken = __ballot_sync(kFullMask, take);
    if (take) {
      const int p = n_picked + __popc(taken & lanes_below);
      pick_key[p] = kj;
      pick_id[p] = lane + 32 * j;
    }
    n_picked += __popc(taken);
  }
}

// The routes of one token, by the calling warp (all 32 lanes, converged). `logits` [E] is read through
// L2 (ld.global.cg), so a kernel may select over logits its other CTAs wrote before a fence.
// `scratch`: kWarpTopkScratchWords words of shared memory of this warp. ids [k], weights [k] out.
// Requires 1 <= k <= min(E, kWarpTopkMaxK) and E <= kWarpTopkMaxExperts. BiasT: float or bf16.
template <class BiasT>
__device__ inline void warp_router_topk_t(const float* logits, const BiasT* bias, int E, int k, bool renormalize,
                                          float scaling, int32_t* ids, float* weights, uint32_t* scratch) {
  constexpr int kBatch = 16;  // loads in flight per lane (branch-free: indices clamped, results masked)
  const int lane = threadIdx.x & 31;
  const int M = (E + 31) / 32;  // keys per lane; key[lane + 32 j] is expert lane + 32 j (0 past E)
  uint32_t* key = scratch;
  uint32_t* surv_key = scratch + kWarpTopkMaxExperts;
  int* surv_id = reinterpret_cast<int*>(surv_key + kWarpTopkSurvivors);
  float* pick_score = reinterpret_cast<float*>(surv_key + 2 * kWarpTopkSurvivors);

  // 1. Keys and each lane's largest.
  bool nan_seen = false;
  uint32_t lane_max = 0u;
  for (int j0 = 0; j0 < M; j0 += kBatch) {
    float lg[kBatch], bs[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = min(lane + 32 * (j0 + u), E - 1);
      lg[u] = __ldcg(logits + e);
      bs[u] = static_cast<float>(bias[e]);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = lane + 32 * (j0 + u);
      const float b = sigmoid_f32(lg[u]) + bs[u];
      const bool real = e < E;
      nan_seen = nan_seen || (real && isnan(b));
      const uint32_t kv = real ? router_order_key(b) : 0u;
      if (j0 + u < M) key[e] = kv;
      lane_max = max(lane_max, kv);
    }
  }
  if (__any_sync(kFullMask, nan_seen)) {
    for (int j = lane; j < k; j += 32) ids[j] = -1, weights[j] = NAN;
    return;
  }

  // 2.-3. The survivors (keys >= m) in id order, then each one's place among them.
  const uint32_t m = warp_kth_largest(lane_max, k);  // > 0: a real key
  const unsigned lanes_below = (1u << lane) - 1u;
  int n_surv = 0;
#pragma unroll 4
  for (int j = 0; j < M; ++j) {
    const uint32_t kj = key[lane + 32 * j];
    const bool s = kj >= m;
    const unsigned bal = __ballot_sync(kFullMask, s);
    const int p = n_surv + __popc(bal & lanes_below);
    if (s && p < kWarpTopkSurvivors) {
      surv_key[p] = kj;
      surv_id[p] = lane + 32 * j;
    }
    n_surv += __popc(bal);
  }
  int n_cand = n_surv;
  if (n_surv > kWarpTopkSurvivors) {  // many ties: the k picks by bisection, placed below
    __syncwarp();
    warp_picks_by_bisection(key, M, k, surv_key, surv_id);
    n_cand = k;
  }
  __syncwarp();
  for (int c = lane; c < n_cand; c += 32) {
    const uint32_t kc = surv_key[c];
    const int ic = surv_id[c];
    int place = 0;
#pragma unroll 8
    for (int i = 0; i < n_cand; ++i) place += router_better(surv_key[i], surv_id[i], kc, ic) ? 1 : 0;
    if (place < k) {
      ids[place] = ic;
      pick_score[place] = sigmoid_f32(__ldcg(logits + ic));  // the same s its key was made from
    }
  }
  __syncwarp();
  float denom = 0.0f;
  if (lane == 0) {
    float sum = 0.0f;  // in place order, sequential (the reference's order)
#pragma unroll
    for (int j = 0; j < kWarpTopkMaxK; ++j)
      if (j < k) sum += pick_score[j];
    denom = sum + 1e-20f;
  }
  denom = __shfl_sync(kFullMask, denom, 0);
  if (lane < k) weights[lane] = renormalize ? pick_score[lane] / denom * scaling : pick_score[lane] * scaling;
  __syncwarp();  // scratch is free for the next call once every lane has read it
}

// warp_router_topk_t for a bias stored as f32 or bf16 (warp-uniform branch).
__device__ inline void warp_router_topk(const float* logits, const void* bias, bool bias_bf16, int E, int k,
                                        bool renormalize, float scaling, int32_t* ids, float* weights,
                                        uint32_t* scratch) {
  if (bias_bf16)
    warp_router_topk_t(logits, static_cast<const bf16*>(bias), E, k, renormalize, scaling, ids, weights, scratch);
  else
    warp_router_topk_t(logits, static_cast<const float*>(bias), E, k, renormalize, scaling, ids, weights, scratch);
}

}  // namespace k3::kernels::cuda_detail
