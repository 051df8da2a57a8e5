// kernels/moe/cuda_router.cu: CUDA sigmoid router with biased top-k (spec §7):
//   s = sigmoid(logits) fp32, b = s + bias; the k best b (higher wins, the lower id on exact ties, as
//   the reference) in descending order; weights use s only:
//   renormalize: w_j = s_j / (sum_{selected, in written order} s + 1e-20) * scaling; else s_j * scaling.
// Two strategies, the same bits:
//   cuda_rank_topk (E <= 1024, k <= 32): a block of 8 warps per token, the ranking
//     selection of cuda_router_select.cuh (K3: E = 896, k = 16).
//   cuda_radix_topk (E <= 8192): a block of 1024 threads per token; each b becomes an
//     order-preserving 32-bit key, a radix select (4 passes of 8 bits over a shared histogram) finds
//     the k-th largest key, the keys above it and the lowest ids among those equal to it are the k
//     picks, and each pick's place is its rank among them.
// A NaN biased score cannot throw from the device: that token gets ids -1 and NaN weights, which the
// expert op turns into a NaN output row (never an out-of-range read).
#include "kernels/moe/cuda_router.h"

#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/moe/cuda_router_select.cuh"
#include "kernels/moe/ops.h"
#include "kernels/moe/router.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

// A block of 1024 threads: at K3's 896 experts each thread holds one expert, so the load, every
// histogram pass and the pick scan are one iteration per thread instead of four: faster per call
// than 256 threads, whose warps each walked a long chain of dependent instructions (measurements:
// docs/perf/fastpath.md, 65cb581: 0ebe545 and the router fold). Still latency-bound: ~20 barriers
// over 4 radix passes.
constexpr int kThreads = 1024;
constexpr int kBins = 256;  // 8-bit digits
static_assert(kThreads >= kBins, "every bin has a thread to clear it");
constexpr int kMaxExperts = 8192;  // shared memory: key + score per expert

// Exclusive prefix over the block of `flag` in thread order (blockDim.x threads), and the total.
__device__ __forceinline__ int block_prefix(bool flag, int* warp_counts, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(kFullMask, flag);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    before += w < warp ? warp_counts[w] : 0;
    all += warp_counts[w];
  }
  __syncthreads();  // warp_counts is reused by the next call
  *total = all;
  return before + __popc(ballot & ((1u << lane) - 1u));
}

__global__ void __launch_bounds__(kThreads)
    router_kernel(const float* logits, int64_t logits_ld, const void* bias, bool bias_bf16, int E, int k, int32_t* ids,
                  int64_t ids_ld, float* weights, int64_t weights_ld, bool renormalize, float scaling) {
  extern __shared__ uint32_t smem[];
  uint32_t* key = smem;                                                // [E]
  float* score = reinterpret_cast<float*>(smem + E);                   // [E]
  uint32_t* pick_key = smem + 2 * E;                                   // [k]
  int* pick_id = reinterpret_cast<int*>(smem + 2 * E + k);             // [k]
  float* pick_score = reinterpret_cast<float*>(smem + 2 * E + 2 * k);  // [k], in written order
  __shared__ int hist[kBins];
  __shared__ int warp_counts[kThreads / 32];
  __shared__ int sel_digit, sel_remaining, n_picked;
  __shared__ float denom;
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  int32_t* ids_t = ids + t * ids_ld;
  float* w_t = weights + t * weights_ld;

  bool nan_seen = false;
  for (int e = tid; e < E; e += blockDim.x) {
    const float s = sigmoid_f32(logits[t * logits_ld + e]);
    const float b = s + load_vec(bias, bias_bf16, e);
    nan_seen = nan_seen || isnan(b);
    score[e] = s;
    key[e] = router_order_key(b);
  }
  if (tid == 0) n_picked = 0;
  if (__syncthreads_or(nan_seen)) {
    for (int j = tid; j < k; j += blockDim.x) ids_t[j] = -1, w_t[j] = NAN;
    return;
  }

  // Radix select: after the passes, `prefix` is the k-th largest key and `remaining` the number of
  // picks among the keys equal to it (the keys above it are k - remaining).
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (tid < kBins) hist[tid] = 0;
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x)
      if ((key[e] & mask) == prefix) atomicAdd(&hist[(key[e] >> shift) & 255u], 1);
    __syncthreads();
    if (tid < 32) {  // lane l: digits 255 - 8l .. 248 - 8l, highest first
      int cnt[8], sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += cnt[i] = hist[255 - 8 * tid - i];
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFullMask, incl, o);
        if (tid >= o) incl += y;
      }
      const unsigned hit = __ballot_sync(kFullMask, incl >= remaining);  // the matching keys >= remaining
      if (tid == __ffs(hit) - 1) {
        int before = incl - sum;
        for (int i = 0; i < 8; ++i) {
          if (before + cnt[i] >= remaining) {
            sel_digit = 255 - 8 * tid - i;
            sel_remaining = remaining - before;
            break;
          }
          before += cnt[i];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sel_digit) << shift;
    mask |= 255u << shift;
    remaining = sel_remaining;
  }
  const int equal = hist[prefix & 255u];  // keys equal to the k-th largest
  __syncthreads();

  // The picks, in no particular order: every key above, and the `remaining` lowest ids of the keys
  // equal (all of them when that is every equal key, else counted in id order).
  for (int e0 = 0; e0 < E; e0 += blockDim.x) {
    const int e = e0 + tid;
    const uint32_t ke = e < E ? key[e] : 0u;
    bool take = e < E && ke > prefix;
    if (equal == remaining) {
      take = take || (e < E && ke == prefix);
    } else {
      int total;
      const int rank = block_prefix(e < E && ke == prefix, warp_counts, &total);
      take = take || (e < E && ke == prefix && rank < remaining);
      remaining -= total;  // the equal keys of the following rounds rank after these
    }
    if (take) {
      const int p = atomicAdd(&n_picked, 1);
      pick_key[p] = ke;
      pick_id[p] = e;
    }
  }
  __syncthreads();
  // Each pick's place is the number of picks better than it.
  for (int j = tid; j < k; j += blockDim.x) {
    const uint32_t kj = pick_key[j];
    const int ij = pick_id[j];
    int place = 0;
    for (int i = 0; i < k; ++i) place += router_better(pick_key[i], pick_id[i], kj, ij);
    ids_t[place] = ij;
    pick_score[place] = score[ij];
  }
  __syncthreads();
  if (tid == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += pick_score[j];
    denom = sum + 1e-20f;
  }
  __syncthreads();
  for (int j = tid; j < k; j += blockDim.x)
    w_t[j] = renormalize ? pick_score[j] / denom * scaling : pick_score[j] * scaling;
}

// One block of kTopkThreads per token: the ranking selection of cuda_router_select.cuh.
__global__ void __launch_bounds__(kTopkThreads)
    rank_topk_kernel(const float* logits, int64_t logits_ld, const void* bias, bool bias_bf16, int E, int k,
                     int32_t* ids, int64_t ids_ld, float* weights, int64_t weights_ld, bool renormalize,
                     float scaling) {
  __shared__ RouterTopkSmem sm;
  const int64_t t = blockIdx.x;
  block_router_topk(logits + t * logits_ld, bias, bias_bf16, E, k, renormalize, scaling, ids + t * ids_ld,
                    weights + t * weights_ld, sm);
}

bool rank_topk_fits(const RouterTopkArgs& a) { return block_router_topk_fits(a.logits.dim(1), a.ids.dim(1)); }

void rank_topk_run(const CudaOps& ops, const RouterTopkArgs& a) {
  const int64_t T = a.logits.dim(0);
  if (T == 0) return;
  rank_topk_kernel<<<static_cast<unsigned>(T), kTopkThreads, 0, ops.ctx->stream()>>>(
      a.logits.as<const float>(), a.logits.strides[0], a.bias.data, a.bias.dtype == core::DType::bf16,
      static_cast<int>(a.logits.dim(1)), static_cast<int>(a.ids.dim(1)), a.ids.as<int32_t>(), a.ids.strides[0],
      a.weights.as<float>(), a.weights.strides[0], a.renormalize, a.scaling);
  K3_CUDA_CHECK_LAUNCH("rank_topk_kernel");
}

void radix_topk_run(const CudaOps& ops, const RouterTopkArgs& a) {
  const int64_t T = a.logits.dim(0);
  const int E = static_cast<int>(a.logits.dim(1)), k = static_cast<int>(a.ids.dim(1));
  if (T == 0) return;
  const size_t smem = sizeof(uint32_t) * (2 * static_cast<size_t>(E) + 3 * static_cast<size_t>(k));
  allow_smem(ops, router_kernel, smem);
  router_kernel<<<static_cast<unsigned>(T), kThreads, smem, ops.ctx->stream()>>>(
      a.logits.as<const float>(), a.logits.strides[0], a.bias.data, a.bias.dtype == core::DType::bf16, E, k,
      a.ids.as<int32_t>(), a.ids.strides[0], a.weights.as<float>(), a.weights.strides[0], a.renormalize, a.scaling);
  K3_CUDA_CHECK_LAUNCH("router_kernel");
}

}  // namespace

core::Status router_topk_cuda_supports(const CudaOps& ops, const RouterTopkArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (a.logits.dim(1) > kMaxExperts)
    return core::Status::fail("at most " + std::to_string(kMaxExperts) + " experts, got " +
                              std::to_string(a.logits.dim(1)));
  return on_cuda({{"logits", &a.logits}, {"bias", &a.bias}, {"ids", &a.ids}, {"weights", &a.weights}});
}

void router_topk_cuda(const CudaOps& ops, const RouterTopkArgs& a) {
  if (rank_topk_fits(a)) rank_topk_run(ops, a);
  else radix_topk_run(ops, a);
}

void register_router_cuda(MoeOps& r, const CudaOps& ops) {
  r.router_topk.add(
      {"cuda_rank_topk", core::Device::cuda,
       [ops](const RouterTopkArgs& a) {
         if (auto s = ops.usable(); !s) return s;
         if (!rank_topk_fits(a))
           return core::Status::fail("the ranking selection takes at most top-" + std::to_string(kTopkMaxK) + " of " +
                                     std::to_string(kTopkMaxExperts) + " experts, got top-" +
                                     std::to_string(a.ids.dim(1)) + " of " + std::to_string(a.logits.dim(1)));
         return on_cuda({{"logits", &a.logits}, {"bias", &a.bias}, {"ids", &a.ids}, {"weights", &a.weights}});
       },
       [ops](const RouterTopkArgs& a) { rank_topk_run(ops, a); }});
  r.router_topk.add({"cuda_radix_topk", core::Device::cuda,
                     [ops](const RouterTopkArgs& a) { return router_topk_cuda_supports(ops, a); },
                     [ops](const RouterTopkArgs& a) { radix_topk_run(ops, a); }});
}

}  // namespace k3::kernels
