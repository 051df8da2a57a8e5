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
// How, without barriers or atomics: lane l writes the order-preserving 32-bit keys of experts
// l, l + 32, ... into the warp's shared scratch (registers would cost the kernels that inline this
// ~50 registers, i.e. occupancy). A bisection over the key bits, most significant first, finds the
// k-th largest key t (count(key >= candidate) by one warp reduction per bit); it stops as soon as
// exactly k keys are >= the candidate, which for real router scores is after ~15-20 of the 32 bits.
// The picks (keys above t, then the lowest ids among the keys equal to t) are compacted in id order,
// and each of the first k lanes places one pick by counting the picks better than it. The radix
// select this replaced (four 8-bit passes over a shared histogram) spent ~18.7K cycles per token on
// ~20 barriers and atomics piled on the few bins that router scores share.
#pragma once
#include <cstdint>

#include "kernels/cuda_common.cuh"

namespace k3::kernels::cuda_detail {

inline constexpr int kWarpTopkMaxExperts = 1024;  // 32 keys per lane
inline constexpr int kWarpTopkMaxK = 32;          // one pick per lane when placing them
// Shared-memory words one warp's selection needs: every expert's key, then key, id and score of up
// to kWarpTopkMaxK picks (4.4 KB).
inline constexpr int kWarpTopkScratchWords = kWarpTopkMaxExperts + 3 * kWarpTopkMaxK;

// Orders like the float (after -0 -> +0, which the reference's != treats as equal to +0). Every real
// key is >= 0x007FFFFF (-inf), so 0 marks "no expert" and is never picked.
__device__ __forceinline__ uint32_t router_order_key(float b) {
  const uint32_t u = __float_as_uint(b + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float router_score(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// The routes of one token, by the calling warp (all 32 lanes, converged). `logits` [E] is read through
// L2 (ld.global.cg), so a kernel may select over logits its other CTAs wrote before a fence.
// `scratch`: kWarpTopkScratchWords words of shared memory of this warp. ids [k], weights [k] out.
// Requires 1 <= k <= min(E, kWarpTopkMaxK) and E <= kWarpTopkMaxExperts.
__device__ inline void warp_router_topk(const float* logits, const void* bias, bool bias_bf16, int E, int k,
                                        bool renormalize, float scaling, int32_t* ids, float* weights,
                                        uint32_t* scratch) {
  const int lane = threadIdx.x & 31;
  const int M = (E + 31) / 32;  // keys per lane; key[lane + 32 j] is expert lane + 32 j (0 past E)
  uint32_t* key = scratch;
  bool nan_seen = false;
  for (int j = 0; j < M; ++j) {
    const int e = lane + 32 * j;
    uint32_t kv = 0u;
    if (e < E) {
      const float b = router_score(__ldcg(logits + e)) + load_vec(bias, bias_bf16, e);
      nan_seen = nan_seen || isnan(b);
      kv = router_order_key(b);
    }
    key[e] = kv;
  }
  if (__any_sync(kFullMask, nan_seen)) {
    for (int j = lane; j < k; j += 32) ids[j] = -1, weights[j] = NAN;
    return;
  }
  __syncwarp();  // (each lane reads only its own keys, but keep the scratch ordered for the picks below)

  // Invariant: at least k keys are >= t. `exact`: exactly k are (then they are the picks).
  uint32_t t = 0u;
  bool exact = false;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = t | (1u << bit);
    unsigned n = 0;
#pragma unroll 4
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
  // Otherwise t is the k-th largest key itself: the keys above it and the `ties` lowest ids equal to it.
  int ties = 0;
  if (!exact) {
    unsigned above = 0;
    for (int j = 0; j < M; ++j) above += key[lane + 32 * j] > t ? 1u : 0u;
    ties = k - static_cast<int>(__reduce_add_sync(kFullMask, above));
  }

  // Compact the picks in id order (expert lane + 32 j: j major, lane minor).
  uint32_t* pick_key = scratch + kWarpTopkMaxExperts;
  int* pick_id = reinterpret_cast<int*>(pick_key + kWarpTopkMaxK);
  float* pick_score = reinterpret_cast<float*>(pick_key + 2 * kWarpTopkMaxK);
  const unsigned lanes_below = (1u << lane) - 1u;
  int n_picked = 0;
  for (int j = 0; j < M; ++j) {
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
  __syncwarp();

  // Lane j < k places pick j: its place is the number of picks better than it.
  if (lane < k) {
    const uint32_t kj = pick_key[lane];
    const int ij = pick_id[lane];
    int place = 0;
    for (int i = 0; i < k; ++i) {
      const uint32_t ki = pick_key[i];
      place += (ki > kj || (ki == kj && pick_id[i] < ij)) ? 1 : 0;
    }
    ids[place] = ij;
    pick_score[place] = router_score(__ldcg(logits + ij));  // the same s its key was made from
  }
  __syncwarp();
  float denom = 0.0f;
  if (lane == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += pick_score[j];
    denom = sum + 1e-20f;
  }
  denom = __shfl_sync(kFullMask, denom, 0);
  if (lane < k) weights[lane] = renormalize ? pick_score[lane] / denom * scaling : pick_score[lane] * scaling;
  __syncwarp();  // scratch is free for the next call once every lane has read it
}

}  // namespace k3::kernels::cuda_detail
